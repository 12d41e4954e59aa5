"""Phase timestamps of a run on stderr, with ``KEYNES_TIMINGS=1`` (benchmarks/cold_start.py reads them).

Each ``mark`` writes one line, ``keynes-timing <unix time> <pid> <phase>``; without the variable
it writes nothing. Ray's actors inherit the variable, and Ray forwards their lines to the run's
stderr (prefixed with the actor's name), so the driver's phases and the actors' interleave.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["ENV", "PREFIX", "mark"]

ENV = "KEYNES_TIMINGS"
PREFIX = "keynes-timing"


def mark(phase: str) -> None:
    """Write ``phase``'s line with the time now, if ``KEYNES_TIMINGS=1``."""
    if os.environ.get(ENV) == "1":  # not print: inside a flow, Prefect's log_prints turns it into a log record
        sys.stderr.write(f"{PREFIX} {time.time():.3f} {os.getpid()} {phase}\n")
        sys.stderr.flush()
