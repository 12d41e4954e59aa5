"""Deployments of the ``experiment`` flow: one per config, with the config's schedule.

``keynes serve CONFIG ...`` registers them with the Prefect API (``PREFECT_API_URL``,
e.g. a ``prefect server start``) and runs what is scheduled or triggered from the UI,
each flow run in its own process, until stopped: one Ctrl-C (or a SIGTERM) stops it
within seconds, and a run it interrupts ends Crashed, its experiment marked ``interrupted``.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Interval, Schedule
from prefect.types.entrypoint import EntrypointType

from flows.config import NAME_REFUSES, ConfigError, ExperimentConfig, ScheduleConfig
from flows.experiment import experiment
from flows.failures import mark_interrupted
from flows.loading import load_config
from flows.processes import kill, running


def schedule_for(schedule: ScheduleConfig | None) -> Schedule | None:
    """The Prefect schedule of a config's ``schedule:`` (None: runs only when triggered).

    Raises:
        ConfigError: the cron line or time zone is not valid.
    """
    if schedule is None:
        return None
    try:
        if schedule.cron is not None:
            return Cron(schedule.cron, timezone=schedule.timezone)
        return Interval(datetime.timedelta(seconds=schedule.interval_s), timezone=schedule.timezone)
    except ValueError as exc:  # croniter's verdict, through Prefect's schedule model
        raise ConfigError(f"schedule.cron: {schedule.cron!r}: {str(exc).splitlines()[-1].strip()}") from None


def describe(cfg: ExperimentConfig, path: Path) -> str:
    """The deployment's description, shown in the UI."""
    if cfg.schedule is None:
        when = "runs when triggered"
    elif cfg.schedule.cron is not None:
        when = f"runs on cron `{cfg.schedule.cron}`" + (f" ({cfg.schedule.timezone})" if cfg.schedule.timezone else "")
    else:
        when = f"runs every {cfg.schedule.interval_s:g} s"
    rounds = "plays the next round per run" if cfg.continue_ else f"plays all {cfg.game.rounds} round(s) per run"
    return (
        f"{cfg.name} ({cfg.experiment_id}) from {path}: {cfg.population.size:,} agents × {len(cfg.arms_list())} arm(s); "
        f"{when}; {rounds}. Edit `overrides` (dotted.key=value) to change any config field for one run."
    )


def deployment_for(
    config: str | Path, overrides: list[str] | None = None, db: str | Path | None = None, name: str | None = None
) -> RunnerDeployment:
    """A deployment of ``experiment`` for one config file.

    Its parameters (the config path, overrides and db) are defaults that the UI's run
    form can change for one run. Runs of one deployment never overlap (a run due while
    another plays is cancelled), so ``continue: true`` plays its rounds in order.

    Args:
        config: the experiment config (YAML); stored as an absolute path.
        overrides: ``dotted.key=value`` settings baked into the deployment's defaults.
        db: the warehouse (default: the config's ``db``, relative to where serve runs).
        name: the deployment's name (default: the experiment's name).

    Raises:
        ConfigError: the config, an override or its schedule is not valid.
    """
    path = Path(config).resolve()
    overrides = list(overrides or [])
    cfg = load_config(path, overrides + ([f"db={db}"] if db else []))
    parameters: dict[str, Any] = {
        "config": str(path),
        "overrides": overrides,
        "db": str(Path(db).resolve()) if db else None,
    }
    return experiment.to_deployment(
        name=name or cfg.name,
        parameters=parameters,
        schedule=schedule_for(cfg.schedule),
        description=describe(cfg, path),
        tags=["keynes", cfg.name],
        # One run at a time; a run due while the last one still plays is cancelled, not
        # queued: the next tick carries on (with `continue: true`, from the next round).
        concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
        # Imported by module name, so runs work from any directory where keynes is installed.
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def deployments_for(configs: list[str | Path], overrides: list[str] | None = None, db: str | Path | None = None) -> list[RunnerDeployment]:
    """One deployment per config; names are the experiments' names, made unique by file name."""
    out: list[RunnerDeployment] = []
    seen: set[str] = set()
    for config in configs:
        deployment = deployment_for(config, overrides, db)
        if deployment.name in seen:
            stem = "".join("-" if c in NAME_REFUSES else c for c in Path(config).stem)  # as the name itself, nothing Prefect refuses
            deployment = deployment_for(config, overrides, db, name=f"{deployment.name}-{stem}")
        if deployment.name in seen:
            raise ConfigError(f"{config}: a deployment named {deployment.name!r} is already served")
        seen.add(deployment.name)
        out.append(deployment)
    return out


#: Seconds the flow runs in progress get to end by themselves once ``keynes serve`` is stopped.
#: A Ctrl-C reaches them too (the terminal signals the whole process group): each marks its
#: experiment interrupted and ends Crashed; what still runs after this is killed and marked here.
RUNS_GRACE_S = 2.0
#: Seconds the runner then gets to pause the deployments' schedules and close its connections.
RUNNER_STOP_S = 1.0
#: Prefect's own message for a run ended by Ctrl-C (``prefect.states.exception_to_crashed_state``).
INTERRUPTED = "Execution was aborted by an interrupt signal."


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
        loop.call_soon_threadsafe(_end_loops, runner)  # no new runs from now on
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


def _end_loops(runner: Any) -> None:
    """End the runner's polling loops, so that ``runner.start()`` returns once its runs have
    ended. This is ``Runner.astop`` without its ``cancel_all``, which would force Cancelled
    ("Runner is shutting down") over the state an interrupted run ended in."""
    runner.stopping = True
    if getattr(runner, "_scheduled_run_poller", None) is not None:
        runner._scheduled_run_poller.stopping = True
    if getattr(runner, "_loops_task_group", None) is not None:
        runner._loops_task_group.cancel_scope.cancel()


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
                client.set_flow_run_state(flow_run_id, Crashed(message=INTERRUPTED), force=True)
                flow_run = client.read_flow_run(flow_run_id)
    except Exception as exc:  # the API is away: the run's processes end all the same
        kill(processes)
        logging.getLogger(__name__).warning("flow run %s: could not mark it interrupted (%s)", flow_run_id, exc)
        return None
    if flow_run.state is not None and flow_run.state.is_completed():
        return None  # it finished in time
    experiment_id = mark_interrupted(**flow_run.parameters)  # a no-op if the run marked it already
    return Interrupted(flow_run.name, flow_run.state.name if flow_run.state else "unknown", experiment_id)


def ping(api_url: str, timeout_s: float = 5.0) -> str | None:
    """None if the Prefect API answers its health check, else what went wrong (one line)."""
    import httpx

    try:
        response = httpx.get(api_url.rstrip("/") + "/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"no Prefect server answers ({type(exc).__name__}); is `prefect server start` running?"
    if response.status_code != 200:
        return f"the health check answered HTTP {response.status_code}"
    return None
