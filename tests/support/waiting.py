"""Waiting for what a test started: a free port to start it on, a condition to become true."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
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
