"""Waiting for what a test started: a free port to start it on, a condition to become true, a URL
that answers. The helpers are benchmarks/servers.py's, which starts the same servers."""

from __future__ import annotations

from benchmarks.servers import answers, free_port, port_is_free, wait_for

__all__ = ["answers", "free_port", "port_is_free", "wait_for"]
