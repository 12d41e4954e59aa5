"""Every use of Prefect's private members, in one place.

keynes reaches under Prefect's public API twice: ``keynes serve`` ends a runner's polling loops
without ``Runner.astop``'s ``cancel_all`` (which would force Cancelled over the state an
interrupted run ended in), and the workers' table artifact is updated in place with the data
``create_table_artifact`` would have sent. Each function here names the private member it uses;
tests/flows/test_prefect_internals.py checks each on the real Prefect, so an upgrade that
renames or changes one fails there, by name.
"""

from __future__ import annotations

import json
from typing import Any


def end_loops(runner: Any) -> None:
    """End a ``prefect.runner.Runner``'s polling loops, so that ``runner.start()`` returns once its
    runs have ended: ``Runner.astop`` without ``cancel_all``. Uses ``Runner._scheduled_run_poller``
    (its ``stopping`` flag) and ``Runner._loops_task_group`` (its cancel scope), both set while the
    runner runs; called in the runner's event loop."""
    runner.stopping = True
    poller = getattr(runner, "_scheduled_run_poller", None)
    if poller is not None:
        poller.stopping = True
    loops = getattr(runner, "_loops_task_group", None)
    if loops is not None:
        loops.cancel_scope.cancel()


def table_artifact_data(rows: list[dict[str, Any]]) -> str:
    """The ``data`` of a table artifact of these rows, as ``create_table_artifact`` stores it (NaN
    as null): ``TableArtifact._sanitize``, for an ``ArtifactUpdate`` of an existing artifact."""
    from prefect.artifacts import TableArtifact

    return json.dumps(TableArtifact._sanitize(rows))
