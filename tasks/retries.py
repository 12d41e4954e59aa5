"""The retry rule every stage task declares on its decorator: retry the engine and I/O, not the input.

Engine and I/O failures (a Ray actor or task error, a locked or unreachable file, a
timeout) are retried with exponential backoff and jitter; bad input is not retried.
"""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import ray.exceptions
from prefect.tasks import exponential_backoff

from warehouse.files import DiskFullError, WarehouseError

#: Errors worth another try: the engine (inside a Ray actor) or the machine, not the input.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.RayError,
    OSError,  # includes ConnectionError and TimeoutError
    WarehouseError,
    duckdb.IOException,
)


#: Set while a flow run that was sent Ctrl-C or SIGTERM ends (``flows.failures`` notes the
#: signals): an error a task meets then is the interrupt's doing — an actor stopped by the same
#: Ctrl-C, a query DuckDB cut short — and a retry would carry the run on as if nothing had been
#: sent.
INTERRUPTED = threading.Event()


def is_transient(error: BaseException | None) -> bool:
    """Whether an error comes from an engine or I/O (retry) rather than from the input (don't);
    a full disk is I/O that no retry mends."""
    return isinstance(error, TRANSIENT_ERRORS) and not isinstance(error, DiskFullError)


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only engine and I/O errors, and none once the run is interrupted."""
    error = state.data if isinstance(state.data, BaseException) else None
    return is_transient(error) and not INTERRUPTED.is_set()


#: The keyword arguments of ``@task`` for a stage that talks to engines or the warehouse:
#: 2 s, 4 s, 8 s… between tries, each ±50 % so that many runs do not retry in step.
ON_TRANSIENT_ERRORS: dict[str, Any] = {
    "retry_delay_seconds": exponential_backoff(backoff_factor=2),
    "retry_jitter_factor": 0.5,
    "retry_condition_fn": retry_transient,
}
