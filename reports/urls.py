"""Addresses of the report server's pages, without importing Panel (flows link to them)."""

from __future__ import annotations

import os
import socket
from urllib.parse import quote

#: The variable that tells a flow run where the report server of ``keynes serve`` is.
REPORT_URL_ENV = "KEYNES_REPORT_URL"


def page_url(base_url: str, experiment_id: str) -> str:
    """The address of an experiment's page on a report server at ``base_url``."""
    return f"{base_url.rstrip('/')}/experiment?id={quote(experiment_id)}"


def public_url(host: str, port: int) -> str:
    """The address others use to reach a server bound to ``host`` (a wildcard becomes the host name)."""
    name = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    return f"http://{name}:{port}"


def report_base_url() -> str | None:
    """The base URL of the report server this process was told about, if any."""
    return os.environ.get(REPORT_URL_ENV) or None
