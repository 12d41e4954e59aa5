"""Deployments of the ``experiment`` flow: one per config, with the config's schedule.

``keynes serve CONFIG ...`` registers them with the Prefect API (``PREFECT_API_URL``,
e.g. a ``prefect server start``) and runs what is scheduled or triggered from the UI
(``cli.runtime.serving``).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Cron, Interval, Schedule
from prefect.types.entrypoint import EntrypointType

from design.config import NAME_REFUSES, ConfigError, ExperimentConfig, ScheduleConfig
from design.loading import load_config, run_overrides
from flows.experiment import experiment


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
    config: str | Path, overrides: list[str] | None = None, db: str | Path | None = None, name: str | None = None,
    models: str | None = None,
) -> RunnerDeployment:
    """A deployment of ``experiment`` for one config file.

    Its parameters (the config path, overrides, db and models profile) are defaults that the UI's run
    form can change for one run. Runs of one deployment never overlap (a run due while
    another plays is cancelled), so ``continue: true`` plays its rounds in order.

    Args:
        config: the experiment config (YAML); stored as an absolute path.
        overrides: ``dotted.key=value`` settings baked into the deployment's defaults.
        db: the warehouse (default: the config's ``db``, relative to where serve runs).
        name: the deployment's name (default: the experiment's name).
        models: a models profile (``design.profiles``) baked into the deployment's defaults.

    Raises:
        ConfigError: the config, an override or its schedule is not valid.
    """
    path = Path(config).resolve()
    overrides = list(overrides or [])
    cfg = load_config(path, run_overrides(overrides, db, models))
    parameters: dict[str, Any] = {
        "config": str(path),
        "overrides": overrides,
        "db": str(Path(db).resolve()) if db else None,
        "models": models,
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


def deployments_for(configs: list[str | Path], overrides: list[str] | None = None, db: str | Path | None = None,
                    models: str | None = None) -> list[RunnerDeployment]:
    """One deployment per config; names are the experiments' names, made unique by file name."""
    out: list[RunnerDeployment] = []
    seen: set[str] = set()
    for config in configs:
        deployment = deployment_for(config, overrides, db, models=models)
        if deployment.name in seen:
            stem = "".join("-" if c in NAME_REFUSES else c for c in Path(config).stem)  # as the name itself, nothing Prefect refuses
            deployment = deployment_for(config, overrides, db, name=f"{deployment.name}-{stem}", models=models)
        if deployment.name in seen:
            raise ConfigError(f"{config}: a deployment named {deployment.name!r} is already served")
        seen.add(deployment.name)
        out.append(deployment)
    return out


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
