"""The Prefect flow ``experiment``: config → personas → rounds of play → warehouse.

The flow only calls the stages in order; each stage is a task in ``tasks/``. Rerunning
the same config resumes: finished rounds are skipped, missing shards are played, no
row is written twice.
"""

from __future__ import annotations

import time
from itertools import groupby
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows.config import ConfigError, ExperimentConfig, load_config
from tasks.environment import group_outcomes, outcome
from tasks.personas import personas_stage
from tasks.play import Arm, ensure_ray, play_round, shutdown_pools
from tasks.store import load_round, store_outcome
from tasks.worker import check_prompt_inputs
from warehouse.store import Warehouse

environment_stage = task(name="environment", cache_policy=NONE)(outcome)
groups_stage = task(name="environment-groups", cache_policy=NONE)(group_outcomes)


def run_row(config: ExperimentConfig, arm: Arm) -> dict[str, Any]:
    """The ``runs`` row of an arm."""
    rule = arm.rule
    return {
        "run_id": arm.run_id,
        "experiment_id": config.experiment_id,
        "arm": arm.index,
        "engine": arm.engine.kind,
        "model": arm.engine.model_name,
        "prompt_mode": arm.prompt_mode,
        "temperature": arm.temperature,
        "ratio": rule.ratio,
        "ratio_value": float(rule.fraction),
        "offset": rule.offset,
        "low": rule.low,
        "high": rule.high,
        "answers": rule.answers,
        "tolerance": rule.tolerance,
        "rounds": rule.rounds,
        "equilibrium": rule.equilibrium,
        "spec": arm.engine.model_dump(mode="json"),
        "status": "running",
    }


def _flow_run_name() -> str:
    from prefect.runtime import flow_run

    params = flow_run.parameters
    source = params.get("config")
    name = source.get("name", "inline") if isinstance(source, dict) else Path(str(source)).stem
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


@flow(name="experiment", flow_run_name=_flow_run_name, log_prints=True)
def experiment(config: str | dict, overrides: list[str] | None = None, db: str | None = None) -> dict[str, Any]:
    """Run (or resume) an experiment.

    Args:
        config: a YAML config path, or the config itself as a mapping.
        overrides: ``dotted.key=value`` settings applied on top of the config.
        db: the warehouse file (overrides ``db`` in the config).

    Returns:
        A summary: experiment id, database, arms, rounds played and rows written.
    """
    cfg = load_config(config, list(overrides or []) + ([f"db={db}"] if db else []))
    logger = get_run_logger()
    warehouse = Warehouse(cfg.db)
    warehouse.begin_experiment(
        cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, cfg.population.size
    )
    personas = personas_stage(
        cfg.experiment_id, cfg.population.load(), cfg.population.size, cfg.seed, warehouse,
        cfg.population.backstories, cfg.workers.actors, cfg.workers.ray_address, cfg.workers.dashboard,
    )
    if cfg.groups is not None:
        personas = personas.with_columns(cfg.groups.assign(personas, cfg.seed))
        warehouse.write_groups(cfg.experiment_id, personas.select("agent_id", "group"))
    arms = cfg.arms_list()
    for arm in arms:
        try:
            check_prompt_inputs(arm, personas)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    ray_info = ensure_ray(cfg.workers.ray_address, cfg.workers.dashboard)
    if ray_info.get("dashboard_url"):
        logger.info("Ray dashboard: http://%s", ray_info["dashboard_url"])
    for arm in arms:
        warehouse.begin_run(run_row(cfg, arm))
    summary: dict[str, Any] = {"experiment_id": cfg.experiment_id, "db": str(cfg.db), "arms": len(arms), "rounds_played": 0, "rows_written": 0}
    try:
        # Arms that share an engine run back to back on the same actors; the pool is
        # released before the next engine loads its model.
        for _, same_engine in groupby(arms, key=lambda a: a.engine.key):
            for arm in same_engine:
                _play_arm(cfg, arm, personas, warehouse, summary)
            shutdown_pools()
    finally:
        shutdown_pools()
    warehouse.finish_experiment(cfg.experiment_id)
    logger.info(
        "experiment %s: %d arm(s), %d round(s) played, %d guesses written to %s",
        cfg.experiment_id, len(arms), summary["rounds_played"], summary["rows_written"], cfg.db,
    )
    return summary


def _play_arm(cfg: ExperimentConfig, arm: Arm, personas, warehouse: Warehouse, summary: dict[str, Any]) -> None:
    finished = set(warehouse.finished_rounds(arm.run_id))
    for round_ in range(1, arm.rule.rounds + 1):
        if round_ in finished:
            continue
        start = time.perf_counter()
        played = play_round(arm, round_, cfg.seed, personas, warehouse, cfg.workers.actors, cfg.workers.shard_size)
        guesses = load_round(warehouse, arm.run_id, round_, personas.height)
        result = environment_stage(guesses, arm.rule)
        groups = groups_stage(guesses, personas.select("agent_id", "group"), arm.rule) if "group" in personas.columns else None
        store_outcome(warehouse, arm.run_id, round_, result, time.perf_counter() - start, groups)
        summary["rounds_played"] += 1
        summary["rows_written"] += played["written"]
    warehouse.finish_run(arm.run_id)
