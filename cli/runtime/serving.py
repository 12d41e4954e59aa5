"""``keynes serve``'s runner: the deployments' flow runs, each in its own process, until stopped.

One Ctrl-C (or a SIGTERM) stops it within seconds, and a run it interrupts ends Crashed, its
experiment marked ``interrupted`` in the warehouse.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import psutil
from prefect.deployments.runner import RunnerDeployment

from cli.runtime.processes import kill, running
from flows.failures import INTERRUPT_MESSAGE, mark_interrupted
from flows.prefect_internals import end_loops

#: Seconds the flow runs in progress get to end by themselves once ``keynes serve`` is stopped.
#: A Ctrl-C reaches them too (the terminal signals the whole process group): each marks its
#: experiment interrupted and ends Crashed; what still runs after this is killed and marked here.
RUNS_GRACE_S = 2.0
#: Seconds the runner then gets to pause the deployments' schedules and close its connections.
RUNNER_STOP_S = 1.0


@dataclass(frozen=True)
class Interrupted:
    """A flow run that was in progress when ``keynes serve`` stopped."""

    name: str
    state: str
    experiment_id: str | None


class _QuietConsole(logging.Filter):
    """``keynes serve``'s own console (its flow runs print their own lines): warnings and errors,
    without the runner's "Process exited with status code: 1": that is how a flow run's process
    ends after the run failed (a refused override, a bug), and the run's own lines (and its state
    in the UI) say why already. ``keynes --verbose serve`` shows everything."""

    def filter(self, record: logging.LogRecord) -> bool:
        if os.environ.get("KEYNES_VERBOSE"):
            return True
        return record.levelno >= logging.WARNING and not record.getMessage().startswith("Process exited with status code: 1.")


def serve(deployments: list[RunnerDeployment], limit: int | None = None) -> list[Interrupted]:
    """Register the deployments and run their flow runs until Ctrl-C or SIGTERM.

    Prefect's runner runs on a thread of its own, so that this (main) thread keeps the signals:
    on the first one it gives the flow runs in progress ``RUNS_GRACE_S`` to end (a Ctrl-C reaches
    them too), kills what still runs, marks what was interrupted (Prefect: Crashed; warehouse:
    ``interrupted``) and lets the runner pause the schedules, all within a few seconds.

    Args:
        deployments: from ``deployments_for``.
        limit: at most this many flow runs at once across deployments (None: no limit).

    Returns:
        The flow runs it interrupted.
    """
    from prefect.logging.handlers import PrefectConsoleHandler
    from prefect.runner import Runner

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            handler.addFilter(_QuietConsole())
    runner = Runner(limit=limit, pause_on_shutdown=True)
    for deployment in deployments:
        runner.add_deployment(deployment)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="prefect-runner", daemon=True).start()
    stop = threading.Event()
    held = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        serving = asyncio.run_coroutine_threadsafe(runner.start(), loop)
        while not stop.wait(0.2):
            if serving.done():
                serving.result()  # the runner ended by itself: raise what ended it
                return []
        loop.call_soon_threadsafe(end_loops, runner)  # no new runs from now on
        deadline = time.monotonic() + RUNS_GRACE_S
        runs = flow_run_processes()
        interrupted = [r for flow_run_id, procs in runs.items() if (r := _interrupted(flow_run_id, procs, deadline))]
        try:  # the runner pauses the schedules and closes its connections
            serving.result(timeout=RUNNER_STOP_S)
        except Exception:  # still closing: the process ends either way
            pass
        return interrupted
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)


def flow_run_processes() -> dict[str, list[psutil.Process]]:
    """Flow run id → the process the runner started for it and its descendants (Ray, ...)."""
    found: dict[str, list[psutil.Process]] = {}
    for child in psutil.Process().children():
        try:
            flow_run_id = child.environ().get("PREFECT__FLOW_RUN_ID")
            if flow_run_id:
                found[flow_run_id] = [child, *child.children(recursive=True)]
        except psutil.Error:  # ended meanwhile
            continue
    return found


def _interrupted(flow_run_id: str, processes: list[psutil.Process], deadline: float) -> Interrupted | None:
    """Make sure a flow run in progress ends marked as interrupted: its state final in Prefect,
    its experiment ``interrupted`` in the warehouse (None: it completed meanwhile).

    A Ctrl-C reached the run too: it marks its experiment and ends Crashed by itself. Once its
    state is final (or at ``deadline``) what is left of its processes (Ray) is killed; a run
    that did not get that far is marked here.
    """
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(flow_run_id)
            while running(processes[0]) and not (flow_run.state and flow_run.state.is_final()) and time.monotonic() < deadline:
                time.sleep(0.1)
                flow_run = client.read_flow_run(flow_run_id)
            kill(processes)
            if flow_run.state is None or not flow_run.state.is_final():
                client.set_flow_run_state(flow_run_id, Crashed(message=INTERRUPT_MESSAGE), force=True)
                flow_run = client.read_flow_run(flow_run_id)
    except Exception as exc:  # the API is away: the run's processes end all the same
        kill(processes)
        logging.getLogger(__name__).warning("flow run %s: could not mark it interrupted (%s)", flow_run_id, exc)
        return None
    if flow_run.state is not None and flow_run.state.is_completed():
        return None  # it finished in time
    experiment_id = mark_interrupted(**flow_run.parameters)  # a no-op if the run marked it already
    return Interrupted(flow_run.name, flow_run.state.name if flow_run.state else "unknown", experiment_id)
