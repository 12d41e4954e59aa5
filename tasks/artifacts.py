"""Prefect artifact helpers shared by the stages and the flow: keys, and publishing that never fails a run."""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

log = logging.getLogger(__name__)


def artifact_key(*parts: object) -> str:
    """An artifact key from parts: lowercase letters, digits and dashes only (Prefect's rule)."""
    text = "-".join(str(p) for p in parts).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text)).strip("-")


def safely(what: str, make: Callable[[], Any]) -> Any:
    """Call ``make``; if the API refuses (or is away), log a warning and return None."""
    try:
        return make()
    except Exception as exc:  # the API being away must not stop 10,000 agents from playing
        log.warning("could not %s: %s", what, exc)
        return None
