"""The Prefect flow ``experiment``: config → personas → for each arm and round: play →
environment → store (the round, then its analyses) → report.

The flow calls the stages in order, each in its module in ``tasks/`` (personas, play,
environment, store, report), and publishes what the Prefect UI shows (``flows/monitor``);
every read and write of the warehouse, the flow's and each stage's, is a call to the store
stage (``tasks/store.py``; tests/test_layering.py checks it), but the report page, which
``reports/`` builds from the file as ``keynes report`` does. Rerunning the same config
resumes: finished rounds are skipped, missing shards are played, no row is written twice.
With ``continue: true`` each run plays only the next round.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import groupby
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.states import Completed

from design.arms import Arm, check_prompt_inputs
from design.budget import check_context
from design.config import ConfigError, ExperimentConfig
from design.inputs import check_inputs, fingerprint
from design.loading import load_config, run_overrides
from design.prompting import check_prompting, engine_index
from design.provenance import collect as provenance_now
from design.shards import sized
from flows import monitor
from flows.failures import one_line_failures
from tasks import progress, store
from tasks.environment import environment, group_environments
from tasks.personas import experiment_personas
from tasks.play import answer_ahead, play_round
from tasks.pool import ensure_ray, shutdown_pools, warm_pool
from tasks.report import report_stage
from tasks.timings import mark


@dataclass(frozen=True)
class ArmPlayed:
    """An arm's rounds in one run of the flow: those played, whether every round of the arm is
    now stored (``complete``), the guesses written, the seconds its analyses took and the seconds
    of its rounds (as ``rounds.seconds`` stores each)."""

    played: tuple[int, ...]
    complete: bool
    rows_written: int
    analyses_s: float
    rounds_s: float = 0.0


@dataclass(frozen=True)
class ExperimentSummary:
    """What a run of the flow did: the experiment and its warehouse, its arms' rounds
    (``rounds``, by run id), the totals, and whether every round of every arm is now played
    (``complete``); ``message`` says why nothing was played, ``report`` is the page written
    (None: none), ``dashboard_url`` the Ray dashboard's."""

    experiment_id: str
    db: str
    arms: int
    rounds: dict[str, ArmPlayed] = field(default_factory=dict)
    complete: bool = False
    analyses_s: float = 0.0
    message: str | None = None
    report: str | None = None
    dashboard_url: str | None = None

    @property
    def rounds_played(self) -> int:
        return sum(len(arm.played) for arm in self.rounds.values())

    @property
    def rows_written(self) -> int:
        return sum(arm.rows_written for arm in self.rounds.values())


def start_workers(cfg: ExperimentConfig, arms: list[Arm], plan: dict[str, list[int]]) -> None:
    """Start Ray and the actors of the first arm that plays, so that they start (and load their
    engine) while the caller does other work; ``play_round`` finds them. Idempotent. Nothing
    when nothing is to be played, nor with backstories: their own actors need the CPUs first.
    """
    if cfg.population.backstories.enabled or not any(plan.values()):
        return
    ensure_ray(cfg.workers.ray_address, cfg.workers.dashboard)
    warm_pool(first_to_play(arms, plan), cfg.population.size, cfg.workers.actors, cfg.workers.shard_size)


def first_to_play(arms: list[Arm], plan: dict[str, list[int]]) -> Arm | None:
    """The arm that plays first in this run (its actors are started first), or None."""
    return next((a for a in arms if plan[a.run_id]), None)


def warm_start(cfg: ExperimentConfig) -> None:
    """``start_workers`` for the rounds the flow will play, before it runs: ``keynes run`` calls
    it while Prefect's temporary API starts, and the flow then finds Ray and the actors up."""
    arms = cfg.arms_list()
    warehouse = store.open_warehouse(cfg.db)
    finished = store.finished_rounds(warehouse, [a.run_id for a in arms], read_only=True)
    cfg = sized(cfg, store.recorded_shard_size(warehouse, cfg.experiment_id, read_only=True))
    start_workers(cfg, arms, round_plan(cfg, arms, finished))


def round_plan(cfg: ExperimentConfig, arms: list[Arm], finished: dict[str, set[int]]) -> dict[str, list[int]]:
    """The rounds each arm plays in this run: every unfinished one, or with
    ``continue: true`` only the next unfinished one."""
    plan = {}
    for arm in arms:
        todo = [r for r in range(1, arm.rule.rounds + 1) if r not in finished[arm.run_id]]
        plan[arm.run_id] = todo[:1] if cfg.continue_ else todo
    return plan


def _flow_run_name() -> str:
    """``<experiment id>: <agents> × <arms> …, round <r> of <n>`` (falls back to the file name)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters
    source = params.get("config")
    fallback = source.get("name", "inline") if isinstance(source, dict) else Path(str(source)).stem
    try:
        cfg = load_config(source, run_overrides(params.get("overrides"), params.get("db"), params.get("models")))
    except Exception:  # the run fails with the reason; its name still says what it was
        try:
            fallback = load_config(source, []).name
        except Exception:
            pass
        return f"{fallback}: invalid config or override, {time.strftime('%Y-%m-%d %H:%M:%S')}"
    arms = cfg.arms_list()
    head = f"{cfg.experiment_id}: {cfg.population.size:,} agents × {len(arms)} arm(s)"
    if not cfg.continue_:
        return f"{head} × {cfg.game.rounds} round(s)"
    try:  # read-only and brief: a name is not worth waiting for a busy warehouse
        finished = store.finished_rounds(store.open_warehouse(cfg.db, lock_timeout_s=2), [a.run_id for a in arms], read_only=True)
    except Exception:
        return f"{head}, next round"
    todo = [r[0] for r in round_plan(cfg, arms, finished).values() if r]
    return f"{head}, round {min(todo)} of {cfg.game.rounds}" if todo else f"{head}, all {cfg.game.rounds} round(s) done"


@flow(name="experiment", flow_run_name=_flow_run_name, log_prints=True)
@one_line_failures
def experiment(config: str | dict, overrides: list[str] | None = None, db: str | None = None, models: str | None = None) -> ExperimentSummary:
    """Run (or resume) an experiment.

    Args:
        config: a YAML config path (on the machine that serves the deployment), or the
            config itself as a mapping.
        overrides: ``dotted.key=value`` settings applied on top of the config, e.g.
            ``population.size=1000``.
        db: the DuckDB warehouse file (overrides ``db`` in the config).
        models: a models profile (``laptop``, ``served`` or a profile file): its engines
            replace the config's LLM engines and backstory engine, before ``overrides``
            (``design.profiles``).

    Returns:
        A summary: experiment id, database, arms, rounds played and rows written, and
        whether every round of every arm is now played (``complete``).
    """
    mark("flow: started")
    cfg = load_config(config, run_overrides(overrides, db, models))
    logger = get_run_logger()
    warehouse = store.open_warehouse(cfg.db)
    arms = cfg.arms_list()
    # Before anything runs: the same experiment id with other templates or models is refused.
    inputs = check_inputs(cfg.experiment_id, store.recorded_inputs(warehouse, cfg.experiment_id), fingerprint(cfg, arms))
    finished = store.finished_rounds(warehouse, [a.run_id for a in arms])
    plan = round_plan(cfg, arms, finished)
    # The shard size this run plays with (recorded with the config below): the first run's when
    # the user sets none, so a resumed round keeps its shard boundaries.
    cfg = sized(cfg, store.recorded_shard_size(warehouse, cfg.experiment_id))
    if not any(plan.values()):
        # Nothing to play (e.g. a scheduled `continue: true` experiment that reached game.rounds):
        # end at once, without starting Ray, and say so where the user looks (log and state).
        store.close_statuses(warehouse, cfg.experiment_id, [a.run_id for a in arms])
        store.record_inputs(warehouse, cfg.experiment_id, inputs)  # one recorded before inputs were gets them
        # A run killed after its last round was stored but before that round's analyses: add
        # them now (with nothing missing this costs three small queries).
        analyses_s = _analyse(warehouse, cfg.experiment_id, arms[-1].run_id, cfg.game.rounds)
        message = (
            f"experiment {cfg.experiment_id} is complete: all {cfg.game.rounds} round(s) of {len(arms)} arm(s) "
            f"are in {cfg.db}; nothing to play"
        )
        logger.info(message)
        summary = ExperimentSummary(cfg.experiment_id, str(cfg.db), len(arms), complete=True, analyses_s=analyses_s, message=message)
        return Completed(message=message, data=summary)  # type: ignore[return-value]

    prompting = check_prompting(cfg, arms)
    store.begin_experiment(
        warehouse, cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, cfg.population.size
    )
    store.record_inputs(warehouse, cfg.experiment_id, inputs)
    mark("flow: experiment row")
    rounds: dict[str, ArmPlayed] = {}
    try:
        start_workers(cfg, arms, plan)  # under `keynes run` they started already, beside Prefect's temporary API
        personas = experiment_personas(
            cfg.experiment_id, cfg.population.load(), cfg.population.size, cfg.seed, warehouse,
            backstories=cfg.population.backstories, actors=cfg.workers.actors, ray_address=cfg.workers.ray_address,
            dashboard=cfg.workers.dashboard,
        )
        mark("flow: personas")
        if cfg.groups is not None:
            personas = personas.with_columns(cfg.groups.assign(personas, cfg.seed))
            store.store_groups(warehouse, cfg.experiment_id, personas.select("agent_id", "group"))
        for arm in arms:
            try:
                check_prompt_inputs(arm, personas)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            try:
                check_context(arm, personas)
            except ValueError as exc:
                raise ConfigError(f"arms.engines.{engine_index(cfg, arm)}.{exc}") from None
        # The arm that plays first (its actors are up already), when it begins with round 1.
        first = first_to_play(arms, plan)
        if first is not None and plan[first.run_id][0] == 1 and answer_ahead(first, cfg.seed, personas, warehouse, cfg.workers.actors, cfg.workers.shard_size):
            mark("flow: round 1's prompts handed ahead")
        dashboard_url = ensure_ray(cfg.workers.ray_address, cfg.workers.dashboard).dashboard_url
        if dashboard_url:
            print(f"Ray dashboard: {monitor.publish_dashboard(dashboard_url)}")
        store.begin_runs(warehouse, [store.run_row(cfg.experiment_id, arm, prompting[arm.run_id]) for arm in arms])
        session = _session()
        store.begin_provenance(warehouse, session, cfg.experiment_id, [a for a in arms if plan[a.run_id]], provenance_now())
        mark("flow: run rows")
        monitor.publish_report(cfg.experiment_id)  # the live page, when a report server runs
        since = datetime.now(timezone.utc)
        workers = monitor.workers_table(cfg.experiment_id)  # this run's table of Ray workers, updated each round
        # Progress goes to whoever listens already (the CLI's bars) and to the Prefect UI.
        with progress.reporting(monitor.Fanout(progress.current(), monitor.ArtifactProgress())):
            # Arms that share an engine run back to back on the same actors; the pool is
            # released before the next engine loads its model.
            for _, same_engine in groupby(arms, key=lambda a: a.engine.key):
                group = list(same_engine)
                for arm in group:
                    rounds[arm.run_id] = _play_arm(cfg, arm, plan[arm.run_id], finished[arm.run_id], personas, warehouse, since, workers)
                    if plan[arm.run_id]:
                        store.finish_provenance(warehouse, arm.run_id, session, plan[arm.run_id])
                if any(plan[arm.run_id] for arm in group):
                    shutdown_pools()
                    mark("flow: actors released")
    finally:
        shutdown_pools()
    mark("flow: played")
    complete = all(rounds[a.run_id].complete for a in arms)
    store.finish_experiment(warehouse, cfg.experiment_id, "completed" if complete else "waiting")
    # Stage 5: the report page, linked in the UI. A failed report loses nothing: the
    # guesses are stored and `keynes report` can build the page later.
    report = None
    if cfg.report.enabled and complete:
        state = report_stage(str(cfg.db), cfg.experiment_id, cfg.report_path, return_state=True)
        if state.is_completed():
            written = state.result()
            monitor.publish_rounds(str(cfg.db), cfg.experiment_id, written.page, written.rounds)
            report = str(written.page)
            logger.info("report: %s", report)
        else:
            logger.error("report failed: %s", state.message)
    summary = ExperimentSummary(
        cfg.experiment_id, str(cfg.db), len(arms), rounds, complete, sum(r.analyses_s for r in rounds.values()),
        report=report, dashboard_url=dashboard_url,
    )
    logger.info(
        "experiment %s: %d arm(s), %d round(s) played, %d guesses written to %s%s",
        cfg.experiment_id, len(arms), summary.rounds_played, summary.rows_written, cfg.db,
        "" if complete else " (continue: the next run plays the next round)",
    )
    return summary


def _session() -> str:
    """This run of the flow, as provenance rows name it: its Prefect flow run id."""
    from prefect.runtime import flow_run

    return str(flow_run.id or uuid.uuid4())


def _play_arm(
    cfg: ExperimentConfig, arm: Arm, rounds: list[int], finished: set[int], personas, warehouse: store.Warehouse, since: datetime,
    workers: monitor.LiveTable,
) -> ArmPlayed:
    """Play an arm's rounds of this run: play → environment → store, each round's outcome published."""
    written = 0
    analyses_s = rounds_s = 0.0
    for round_ in rounds:
        start = time.perf_counter()
        played = play_round(arm, round_, cfg.seed, personas, warehouse, cfg.workers.actors, cfg.workers.shard_size)
        mark(f"flow: round {round_} played")
        with store.held(warehouse):  # the round's bookkeeping opens the file once
            guesses = store.load_round(warehouse, arm.run_id, round_, personas.height)
            result = environment(arm.run_id, round_, guesses, arm.rule)
            groups = (
                group_environments(arm.run_id, round_, guesses, personas.select("agent_id", "group"), arm.rule)
                if "group" in personas.columns else None
            )
            seconds = time.perf_counter() - start
            rounds_s += seconds
            store.store_outcome(warehouse, arm.run_id, round_, result, seconds, groups)
            analyses_s += _analyse(warehouse, cfg.experiment_id, arm.run_id, round_)
            monitor.publish_workers(warehouse, cfg.experiment_id, since, workers)
        mark(f"flow: round {round_} stored and analysed")
        monitor.publish_round(arm, round_, result, seconds)
        written += played.written
    complete = finished.union(rounds) >= set(range(1, arm.rule.rounds + 1))
    store.finish_run(warehouse, arm.run_id, "completed" if complete else "waiting")
    return ArmPlayed(tuple(rounds), complete, written, analyses_s, rounds_s)


def _analyse(warehouse: store.Warehouse, experiment_id: str, run_id: str, round_: int) -> float:
    """The analyses a stored round completes; the seconds they took. A failure costs nothing
    stored: it is logged, and the next round or ``keynes report`` computes what is missing."""
    state = store.store_analyses(warehouse, experiment_id, run_id, round_, return_state=True)
    if state.is_completed():
        return state.result().elapsed_s
    get_run_logger().warning("analyses of %s round %d failed (%s); keynes report computes them later", run_id, round_, state.message)
    return 0.0
