"""Progress reporting without knowing who listens.

Stages report progress here; the CLI installs a rich progress bar, the Prefect flow an
artifact updater; by default nothing is shown. Keeps ``tasks`` free of any UI.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol


class Bar(Protocol):
    def advance(self, n: int) -> None: ...
    def finish(self) -> None: ...


class Reporter(Protocol):
    def start(self, label: str, total: int, completed: int = 0) -> Bar: ...


class _Silent:
    def start(self, label: str, total: int, completed: int = 0) -> "_Silent":
        return self

    def advance(self, n: int) -> None:
        pass

    def finish(self) -> None:
        pass


_current: list[Reporter] = [_Silent()]


def current() -> Reporter:
    """The reporter in use (silent unless one was installed)."""
    return _current[-1]


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Install a reporter for the duration of a block."""
    _current.append(reporter)
    try:
        yield reporter
    finally:
        _current.remove(reporter)
