"""The processes a ``keynes`` command started, found by the mark it gives them.

``cli.runtime.processes.guard`` puts ``KEYNES_RUN_TAG=<pid>:<start>`` in the command's environment, which
every process it starts inherits (Ray's agents that outlive their parent too). A test that builds
the mark itself builds it here, the way ``guard`` does, and waits until a process carries it: a
mark built any other way matches nothing, and "nothing of the command is left" could not fail.
"""

from __future__ import annotations

import psutil

from cli.runtime.processes import tag_of, tagged
from tests.support.waiting import wait_for


def mark_of(pid: int) -> str:
    """The mark the ``keynes`` command running as ``pid`` gives every process it starts."""
    return tag_of(psutil.Process(pid))


def marked(mark: str, exclude: set[int] | None = None) -> list[psutil.Process]:
    """The live processes carrying ``mark`` (zombies not counted), but those in ``exclude``."""
    return tagged(mark, exclude or set())


def wait_marked(mark: str, timeout_s: float = 120) -> list[psutil.Process]:
    """Wait until a process carries ``mark`` (the command's watchdog is the first): the mark is the
    command's own, so that finding none of its processes later means none is left."""
    return wait_for(lambda: marked(mark), timeout_s, f"a process carrying the mark {mark} (KEYNES_RUN_TAG)")

