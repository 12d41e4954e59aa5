"""flows/prefect_internals.py on the real Prefect: each use of Prefect's private members still does
what keynes relies on. An upgrade that renames or changes one fails here, by name, before
``keynes serve`` hangs on Ctrl-C or the workers' table shows stale numbers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flows import prefect_internals

pytestmark = pytest.mark.quick


def test_table_artifact_sanitize_turns_nan_into_null_at_any_depth():
    from prefect.artifacts import TableArtifact

    rows = [{"agents/s": float("nan"), "node": "a", "seconds": [1.5, float("nan")]}]
    assert TableArtifact._sanitize(rows) == [{"agents/s": None, "node": "a", "seconds": [1.5, None]}]
    assert prefect_internals.table_artifact_data(rows) == '[{"agents/s": null, "node": "a", "seconds": [1.5, null]}]'


def test_a_started_runner_returns_once_its_loops_are_ended(prefect_api):
    """``Runner.start`` sets ``_scheduled_run_poller`` and ``_loops_task_group``; ``end_loops`` stops
    the one and cancels the other from the runner's event loop, and ``start`` returns (as ``keynes
    serve`` does it on Ctrl-C: the loop in a thread of its own)."""
    from prefect.runner import Runner

    runner = Runner(name="keynes-prefect-internals", query_seconds=1, pause_on_shutdown=False)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="runner-under-test", daemon=True)
    thread.start()
    try:
        serving = asyncio.run_coroutine_threadsafe(runner.start(webserver=False), loop)
        deadline = time.monotonic() + 120
        while not (runner.started and getattr(runner, "_loops_task_group", None) is not None):
            assert not serving.done(), f"the runner ended by itself: {serving.exception()!r}"
            assert time.monotonic() < deadline, "the runner did not start in 120 s"
            time.sleep(0.1)
        poller = runner._scheduled_run_poller
        assert poller.stopping is False
        assert hasattr(runner._loops_task_group, "cancel_scope")
        loop.call_soon_threadsafe(prefect_internals.end_loops, runner)
        serving.result(timeout=60)  # start() returned: its loops ended
        assert runner.stopping is True and poller.stopping is True
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
