"""Who may read the pages of a report server (without importing Panel: the CLI checks first).

On a loopback address (127.0.0.1) the pages are for this machine only and ask no login. Bound
to any other address (e.g. 0.0.0.0) a server asks for a login (Panel's basic auth: a form at
``/login``, then a signed cookie): one password from ``KEYNES_REPORT_PASSWORD`` (any user name)
or a credentials file of users and passwords. Sharing with no login takes an explicit
``--public``; with neither, the server does not start.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

#: The variable holding the one password of a shared report server.
PASSWORD_ENV = "KEYNES_REPORT_PASSWORD"


class LoginError(ValueError):
    """A shared server with no login and no ``--public``, or an unreadable credentials file."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` keeps a server on this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or a wildcard: reachable from elsewhere


def read_credentials(path: Path) -> dict[str, str]:
    """The users and passwords of a credentials file: a JSON object ``{"user": "password"}``."""
    try:
        users = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LoginError(f"{path}: cannot read it ({exc.strerror})") from None
    except ValueError as exc:
        raise LoginError(f"{path}: not JSON ({exc})") from None
    if not isinstance(users, dict) or not users or not all(isinstance(u, str) and u and isinstance(p, str) and p
                                                          for u, p in users.items()):
        raise LoginError(f'{path}: expected a JSON object of users and passwords, e.g. {{"ada": "a long password"}}')
    return users


def login_for(host: str, credentials: Path | None = None, public: bool = False, prefix: str = "") -> str | dict[str, str] | None:
    """What a server bound to ``host`` checks a login against (Panel's ``basic_auth``): None for
    no login (loopback, or ``public`` with no login set), the users of ``credentials``, else the
    password of ``KEYNES_REPORT_PASSWORD``. ``prefix`` names the CLI's options in the error
    (``report-`` for ``keynes serve``)."""
    if is_loopback(host):
        return None
    if credentials is not None:
        return read_credentials(credentials)
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if public:
        return None
    raise LoginError(f"--{prefix}host {host} shares the report pages beyond this machine: set {PASSWORD_ENV} "
                     f"or --{prefix}credentials FILE for a login, or say --{prefix}public to share them with no login")


def describe(login: str | dict[str, str] | None, host: str) -> str:
    """One line on who may read the pages (never a password)."""
    if is_loopback(host):
        return "this machine only, no login"
    if login is None:
        return "public: anyone who reaches the port, no login"
    if isinstance(login, dict):
        return f"login: {len(login)} user(s) of the credentials file"
    return f"login: {PASSWORD_ENV}, any user name"
