"""Input errors fail a flow run as one line: in its state, in its log, without a traceback.

A config or warehouse problem (a bad override typed in the UI's run form, a missing folder)
is the user's to fix, and its message says how; a traceback would only hide it. Other
exceptions are bugs and keep Prefect's usual handling, traceback included.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from prefect import get_run_logger
from prefect.states import Failed

from flows.config import ConfigError
from warehouse.store import WarehouseError

#: Errors whose message is the whole story (each names the field or file and the value).
INPUT_ERRORS: tuple[type[Exception], ...] = (ConfigError, WarehouseError)


class _NoInputTracebacks(logging.Filter):
    """Drops Prefect's "exited with unexpected exception" records (and their tracebacks) when
    the exception is an input error: the run already failed with its one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, INPUT_ERRORS)


# A deployment's flow run runs in `python -m prefect.engine`, which raises the Failed state's
# exception once more and logs it with a traceback twice: on the flow run's logger (sent to the
# API) and on the engine's.
for _name in ("prefect.flow_runs", "prefect.engine"):
    logging.getLogger(_name).addFilter(_NoInputTracebacks())


def one_line_failures(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a flow function: an input error becomes a Failed state with its message.

    The exception travels as the state's data, so a caller of the flow (``keynes run``)
    gets it raised as it was.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except INPUT_ERRORS as exc:
            message = str(exc)
            get_run_logger().error(message)
            return Failed(message=message, data=exc)

    return wrapper
