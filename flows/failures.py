"""How a flow run ends when it cannot finish: in one line, without a traceback.

A config or warehouse problem (a bad override typed in the UI's run form, a missing folder)
is the user's to fix, and its message says how; a traceback would only hide it. An
interrupt (Ctrl-C, a SIGTERM) marks the experiment and its unfinished arms ``interrupted`` in
the warehouse, and the run ends as Prefect ends an interrupted run: Crashed, "Execution was
aborted by an interrupt signal" (or by "a termination signal", "Python system exit call").
Other exceptions are bugs and keep Prefect's usual handling, traceback included.

A flow run that ``keynes serve`` started runs in its own process, whose output is the serve
console's: there its tasks' INFO lines (four per round and arm) go to the Prefect UI only.
``install`` sets up these logging filters (and, in such a process, the exit hook); the flow
calls it as it starts (``one_line_failures``), and importing this module changes nothing.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import get_run_logger
from prefect.exceptions import TerminationSignal
from prefect.logging.handlers import PrefectConsoleHandler
from prefect.states import Failed

from design.config import ConfigError
from design.loading import load_config, run_overrides
from tasks import store
from tasks.retries import INTERRUPTED
from tasks.store import WarehouseError

#: Errors whose message is the whole story (each names the field or file and the value).
INPUT_ERRORS: tuple[type[Exception], ...] = (ConfigError, WarehouseError)
#: How a run is stopped from outside: Ctrl-C, or a SIGTERM (Prefect raises it as TerminationSignal;
#: while the flow waits on Ray, Ray's driver raises it as SystemExit).
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, TerminationSignal, SystemExit)
#: Prefect's own message for a run ended by Ctrl-C (``prefect.states.exception_to_crashed_state``),
#: which ``keynes serve`` gives a run it has to end itself.
INTERRUPT_MESSAGE = "Execution was aborted by an interrupt signal."
#: Seconds an interrupted run waits for its warehouse (a reader may hold it a moment).
MARK_LOCK_TIMEOUT_S = 2.0


def _expected(record: logging.LogRecord) -> bool:
    """Whether a log record carries an input error or an interrupt, which the run reports in one line."""
    error = record.exc_info[1] if record.exc_info else None
    return isinstance(error, INPUT_ERRORS + INTERRUPTS)


class _NoExpectedTracebacks(logging.Filter):
    """Drops Prefect's "exited with unexpected exception" / "interrupted by base exception"
    records (and their tracebacks) for input errors and interrupts: the run already ended
    with its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _expected(record)


class _TaskRunsToTheUIOnly(logging.Filter):
    """On a served flow run's console: drops the task runs' INFO records (they still reach the UI)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("prefect.task_runs")


class _QuietInterrupts:
    """``sys.excepthook`` of a served flow run's process: no traceback for an interrupt that ends
    it (Python would print it once more on the way out); anything else goes to the hook before."""

    def __init__(self, previous: Callable[..., Any]):
        self.previous = previous

    def __call__(self, kind, value, traceback) -> None:
        if not isinstance(value, INTERRUPTS):
            self.previous(kind, value, traceback)


def _add_once(target: logging.Logger | logging.Handler, kind: type[logging.Filter]) -> None:
    if not any(isinstance(f, kind) for f in target.filters):
        target.addFilter(kind())


def install() -> None:
    """Make failures one line wherever Prefect would print them again; idempotent.

    A deployment's flow run runs in ``python -m prefect.engine``, which raises the Failed
    state's exception (or the interrupt) once more and logs it with a traceback twice: on the
    flow run's logger (sent to the API) and on the engine's; both drop those records. In a flow
    run's own process (a runner sets PREFECT__FLOW_RUN_ID), unless ``keynes --verbose``, the
    console also drops task runs' INFO lines, and an interrupt ends the process without a traceback.
    """
    for name in ("prefect.flow_runs", "prefect.engine"):
        _add_once(logging.getLogger(name), _NoExpectedTracebacks)
    if not os.environ.get("PREFECT__FLOW_RUN_ID") or os.environ.get("KEYNES_VERBOSE"):
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            _add_once(handler, _TaskRunsToTheUIOnly)
    if not isinstance(sys.excepthook, _QuietInterrupts):
        sys.excepthook = _QuietInterrupts(sys.excepthook)


def mark_interrupted(config: str | dict, overrides: list[str] | None = None, db: str | None = None, models: str | None = None) -> str | None:
    """Mark the experiment of a flow run's parameters, and its arms still running, ``interrupted``.

    Returns:
        The experiment id, or None when there is nothing to mark (no valid config, no
        warehouse yet) or the warehouse could not be written (a warning says why).
    """
    try:
        cfg = load_config(config, run_overrides(overrides, db, models))
    except ConfigError:
        return None
    if not Path(cfg.db).exists():
        return None
    try:
        store.mark_interrupted(store.open_warehouse(cfg.db, lock_timeout_s=MARK_LOCK_TIMEOUT_S), cfg.experiment_id)
    except Exception as exc:  # an interrupted run must still end
        logging.getLogger(__name__).warning("could not mark %s interrupted in %s: %s", cfg.experiment_id, cfg.db, exc)
        return None
    return cfg.experiment_id


@contextmanager
def _signals_held() -> Iterator[None]:
    """Ignore a second Ctrl-C or SIGTERM while an interrupted run records that it was."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


@contextmanager
def _signals_noted() -> Iterator[list[int]]:
    """Note every Ctrl-C and SIGTERM before its handler runs (the list yielded).

    A signal that arrives during a C call is handled when the call checks for one: DuckDB then
    turns the handler's exception into its own error ("Query interrupted", the interrupt gone
    from the chain). Noted, the run still ends as interrupted.
    """
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    # A signal the process ignores (SIGINT, for a job started in a script's background) stays ignored.
    previous = {s: h for s in (signal.SIGINT, signal.SIGTERM) if (h := signal.getsignal(s)) != signal.SIG_IGN}

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        INTERRUPTED.set()  # no task retries an error from now on: the interrupt caused it
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:  # what the signal would have done: end the process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for signum in previous:
        signal.signal(signum, note)
    INTERRUPTED.clear()
    try:
        yield noted
    finally:
        INTERRUPTED.clear()
        for signum, handler in previous.items():
            if signal.getsignal(signum) is note:
                signal.signal(signum, handler)


def _interrupt(signum: int) -> BaseException:
    """The exception Ctrl-C or a SIGTERM raises in a flow run."""
    return KeyboardInterrupt() if signum == signal.SIGINT else TerminationSignal(signal=signum)


def _as_parameter(message: str) -> str:
    """An override error names the flow's ``overrides`` parameter, not the CLI's ``--set``:
    in a flow run, overrides come from its parameters (the UI's run form, ``run_deployment``)."""
    return "overrides " + message.removeprefix("--set ") if message.startswith("--set ") else message


def one_line_failures(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the ``experiment`` flow function (``install`` first): an input error becomes a Failed state with its
    message; an interrupt marks the experiment interrupted and goes on to Prefect (also one
    that a C call turned into its own error: it is raised again as the interrupt it was).

    The exception travels as the state's data, so a caller of the flow (``keynes run``)
    gets it raised with the state's message.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        install()
        with _signals_noted() as noted:
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                interrupted = isinstance(exc, INTERRUPTS) or (bool(noted) and isinstance(exc, Exception))
                if not interrupted and isinstance(exc, INPUT_ERRORS):
                    message = _as_parameter(str(exc))
                    get_run_logger().error(message)
                    return Failed(message=message, data=exc if message == str(exc) else type(exc)(message))
                if not interrupted:
                    raise
                with _signals_held():
                    mark_interrupted(*args, **kwargs)
                if isinstance(exc, INTERRUPTS):
                    raise
                # a C call (a DuckDB query) turned the signal into its own error
                raise _interrupt(noted[-1]) from exc

    return wrapper
