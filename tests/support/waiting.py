"""Waiting for what a test started: a free port to start it on, a condition to become true."""

from __future__ import annotations

import random
import socket
import time
from typing import Any, Callable

#: Ports ``free_port`` draws from start here: below it are Ray's worker ports (10002-19999) and
#: the usual service ports.
_LOWEST = 20_000
#: Not the ``random`` module: pytest-randomly reseeds it before every test, so every test process
#: with the same seed would draw the same ports.
_RNG = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out by itself (Linux; the usual default elsewhere)."""
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` on 127.0.0.1 now (with SO_REUSEADDR, as servers do)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, for a server to start on.

    The port is free when returned, not reserved: whoever binds it first gets it. It is drawn at
    random below the kernel's ephemeral range, which the kernel never hands out by itself, so no
    outgoing connection and no bind to port 0 on the machine can take it in between; only a
    process that asks for that very port can. A server started on it should still handle a
    failed bind (``LlamaServer`` does).
    """
    low, _ = _ephemeral_range()
    if low - _LOWEST >= 1000:
        for port in _RNG.sample(range(_LOWEST, low), 200):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: also skips ports with lingering connections
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # an unusual port range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something true (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def answers(url: str, timeout_s: float = 30) -> bool:
    """Whether ``url`` answers HTTP 200 now (a server not yet up, or refusing, is False)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False
