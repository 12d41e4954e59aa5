"""Stage 4, store: every read and write the stages and the flow make of the warehouse.

The experiment's and its arms' rows and statuses open and close a run; the personas stage
stores and reads back the population and the backstory cache; play hands each batch of
finished shards to ``commit_shards`` (one transaction, keyed so a re-played shard writes
nothing twice); once every agent's guess is stored the round's outcome and winners are
committed in one transaction, exactly once, and ``store_analyses`` then adds the τ fits and
paired tests that round completes (so they are in the warehouse as soon as the round is,
report or not). Before a round, ``stored_round`` hands play what is stored already (agents
done, own guesses, history); after it, ``workers`` tells the Prefect UI who played it, and
the report stage reads ``round_summary``.

This is the only module of ``tasks/`` and ``flows/`` that imports ``warehouse`` (but for the
two error classes the retry rule names, ``tasks/retries.py``) or touches the handle
``open_warehouse`` returns; the others hold that handle (typed ``Warehouse``) and pass it here
(tests/test_layering.py). The report page itself is ``reports/``'s, which reads the file on its
own, as ``keynes report`` does. Where the stage adds something a
function does it: the rows it builds (``run_row``, ``commit_shards``' records), what it reads
together (``stored_round``, ``personas_identity``), its rules (``close_statuses``, the
complete round ``load_round`` insists on). The rest forward one call to ``warehouse.store``,
and stay: they are the boundary itself, one place that lists every fact a stage reads or
writes, with the SQL one module further down.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from core.game import RoundOutcome
from design.arms import Arm
from design.inputs import arm_inputs
from design.provenance import Environment
from engines import Prompting
from tasks.actor import ShardJob, ShardResult
from tasks.retries import ON_TRANSIENT_ERRORS
from warehouse import provenance
from warehouse.backstories import read_backstories, write_backstories
from warehouse.store import RunRow, ShardRecord, Warehouse, WarehouseError

__all__ = [
    "AnalysesStored", "RunRow", "StoredRound", "Warehouse", "WarehouseError", "WorkerLoad", "begin_experiment", "begin_runs",
    "begin_provenance", "cached_backstories", "close_statuses", "commit_shards", "finish_experiment", "finish_provenance", "finish_run",
    "finished_rounds", "held", "load_round", "mark_interrupted", "open_warehouse", "personas_identity", "read_personas", "record_inputs",
    "recorded_inputs", "recorded_shard_size", "round_summary", "run_row",
    "store_analyses", "store_backstories", "store_groups", "store_outcome", "store_personas", "stored_personas", "stored_round",
    "workers",
]


def open_warehouse(db: str | Path, lock_timeout_s: float | None = None) -> Warehouse:
    """The experiment's warehouse (a DuckDB file, created and migrated on first use)."""
    return Warehouse(db) if lock_timeout_s is None else Warehouse(db, lock_timeout_s=lock_timeout_s)


def held(warehouse: Warehouse) -> AbstractContextManager[None]:
    """The warehouse file kept open while a block of bookkeeping runs (``WarehouseFile.held``):
    a round's reads and writes after play open it once instead of a dozen times."""
    return warehouse.held()


def finished_rounds(warehouse: Warehouse, run_ids: list[str], read_only: bool = False) -> dict[str, set[int]]:
    """The rounds whose outcome is stored, for each of ``run_ids`` (an empty set: none yet)."""
    return {run_id: set() for run_id in run_ids} | warehouse.finished_rounds(run_ids, read_only=read_only)


def run_row(experiment_id: str, arm: Arm, prompting: Prompting | None = None) -> RunRow:
    """The ``runs`` row of an arm (``prompting``: its engine's resolved prompt format, resolved
    here when not given)."""
    rule = arm.rule
    return RunRow(
        run_id=arm.run_id,
        experiment_id=experiment_id,
        arm=arm.index,
        engine=arm.engine.kind,
        model=arm.engine.model_name,
        prompt_mode=arm.prompt_mode,
        temperature=arm.temperature,
        ratio=rule.ratio,
        ratio_value=float(rule.fraction),
        offset=rule.offset,
        low=rule.low,
        high=rule.high,
        answers=rule.answers,
        tolerance=rule.tolerance,
        rounds=rule.rounds,
        equilibrium=rule.equilibrium,
        spec=arm.engine.model_dump(mode="json"),
        prompting=(prompting if prompting is not None else arm.engine.prompting()).as_json(),
        sampling=arm.sampling.model_dump(mode="json"),
    )


def recorded_shard_size(warehouse: Warehouse, experiment_id: str, read_only: bool = False) -> int | None:
    """The shard size the experiment's first run played with (recorded by ``begin_experiment``
    in its config), or None: a resumed round keeps the shard boundaries it started with."""
    return warehouse.recorded_shard_size(experiment_id, read_only=read_only)


def begin_experiment(
    warehouse: Warehouse, experiment_id: str, name: str, config: dict[str, Any], config_hash: str, seed: int, population: int,
) -> None:
    """Record the experiment (status ``running``); a rerun keeps its first ``created_at``."""
    warehouse.begin_experiment(experiment_id, name, config, config_hash, seed, population)


def recorded_inputs(warehouse: Warehouse, experiment_id: str) -> dict[str, str] | None:
    """The inputs the experiment's first run recorded (None: new, or recorded before inputs were)."""
    return provenance.recorded_inputs(warehouse, experiment_id)


def record_inputs(warehouse: Warehouse, experiment_id: str, inputs: dict[str, str]) -> None:
    """Record the experiment's inputs, as ``design.inputs.check_inputs`` returns them."""
    provenance.record_inputs(warehouse, experiment_id, inputs)


def begin_provenance(warehouse: Warehouse, session: str, experiment_id: str, arms: list[Arm], environment: Environment) -> None:
    """Record what computes each of ``arms`` in this session: the environment, and each arm's
    models and templates (``design.inputs.arm_inputs``)."""
    rows = []
    for arm in arms:
        inputs = arm_inputs(arm)
        templates = {k: v for k, v in inputs.items() if k.startswith("template ")}
        rows.append(provenance.ProvenanceRow(
            arm.run_id, session, experiment_id, environment.keynes_version, environment.git_commit, environment.git_modified,
            environment.python, environment.packages, {k: v for k, v in inputs.items() if k not in templates}, templates,
            environment.machine,
        ))
    provenance.begin_provenance(warehouse, rows)


def finish_provenance(warehouse: Warehouse, run_id: str, session: str, rounds: list[int]) -> None:
    """This session played these rounds of the arm and is done with it."""
    provenance.finish_provenance(warehouse, run_id, session, rounds)


def begin_runs(warehouse: Warehouse, runs: list[RunRow]) -> None:
    """Record each arm's ``runs`` row (status ``running``), as ``run_row`` makes them."""
    with warehouse.held():
        for run in runs:
            warehouse.begin_run(run)


def store_groups(warehouse: Warehouse, experiment_id: str, groups: pl.DataFrame) -> int:
    """Record each agent's group (``agent_id``, ``group``) of a nested-environments experiment."""
    return warehouse.write_groups(experiment_id, groups)


def finish_run(warehouse: Warehouse, run_id: str, status: str = "completed") -> None:
    """Set an arm's status: ``completed``, or ``waiting`` for its next round (``continue: true``)."""
    warehouse.finish_run(run_id, status)


def finish_experiment(warehouse: Warehouse, experiment_id: str, status: str = "completed") -> None:
    """Set the experiment's status: ``completed`` or ``waiting``."""
    warehouse.finish_experiment(experiment_id, status)


def close_statuses(warehouse: Warehouse, experiment_id: str, run_ids: list[str]) -> None:
    """Mark a fully played experiment completed if a crash left it marked otherwise."""
    statuses = warehouse.statuses(experiment_id)
    if statuses and statuses != {"completed"}:
        for run_id in run_ids:
            warehouse.finish_run(run_id)
        warehouse.finish_experiment(experiment_id)


def mark_interrupted(warehouse: Warehouse, experiment_id: str) -> None:
    """Mark an experiment and its arms still ``running`` as ``interrupted`` (Ctrl-C, SIGTERM)."""
    warehouse.interrupt(experiment_id)


@dataclass(frozen=True)
class StoredRound:
    """What the warehouse holds for an arm before one of its rounds is played.

    ``done``: agent ids whose guess of the round is stored; ``own_guesses``: each agent's
    earlier guesses (``agent_id``, ``own_guesses``, oldest first; None in round 1);
    ``history``: the earlier rounds' outcomes; ``group_history``: each group's (None
    unless the population is grouped).
    """

    done: np.ndarray
    own_guesses: pl.DataFrame | None
    history: list[dict[str, Any]]
    group_history: dict[str, list[dict[str, Any]]] | None


def stored_round(warehouse: Warehouse, run_id: str, round_: int, grouped: bool) -> StoredRound:
    """Read what play needs before round ``round_`` of ``run_id`` (``grouped``: nested environments)."""
    with warehouse.held():
        return StoredRound(
            done=warehouse.committed_agents(run_id, round_),
            own_guesses=warehouse.own_guesses(run_id, round_) if round_ > 1 else None,
            history=warehouse.history(run_id, round_),
            group_history=warehouse.group_history(run_id, round_) if grouped else None,
        )


def commit_shards(warehouse: Warehouse, finished: list[tuple[ShardJob, ShardResult]]) -> int:
    """Commit finished shards of one round (guesses and ``shards`` rows) in one transaction.

    Returns:
        The number of guesses written (rows already stored are skipped).
    """
    return warehouse.write_shards([
        ShardRecord(
            result.guesses, job.arm.run_id, job.round, job.shard, job.agents.height, result.node, result.worker, result.seconds,
            limit_wait_s=result.limit_wait_s, tokens_evaluated=result.tokens_evaluated, tokens_bound=result.tokens_bound,
            distributions=result.distributions,
        )
        for job, result in finished
    ])


@task(name="load-round", cache_policy=NONE, retries=3, task_run_name="load-{run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def load_round(warehouse: Warehouse, run_id: str, round_: int, expected: int) -> pl.DataFrame:
    """The round's guesses (retried on I/O errors); fails if any agent's guess is missing,
    which no retry of this task can mend (the round is re-played by the next run)."""
    guesses = warehouse.round_guesses(run_id, round_)
    if guesses.height != expected:
        raise RuntimeError(f"{run_id} round {round_}: {guesses.height} guesses stored, expected {expected}")
    return guesses


@task(name="store", cache_policy=NONE, retries=3, task_run_name="store-{run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def store_outcome(
    warehouse: Warehouse, run_id: str, round_: int, outcome: RoundOutcome, seconds: float,
    groups: dict[str, RoundOutcome] | None = None,
) -> bool:
    """Commit the round's outcome and winners, and each group's (once); True if this call wrote them."""
    return warehouse.write_outcome(run_id, round_, outcome, seconds, groups)


@dataclass(frozen=True)
class AnalysesStored:
    """What ``store_analyses`` added: rows of ``tau_fits`` and ``paired_tests``, and how long it took."""

    tau_fits: int
    paired_tests: int
    elapsed_s: float


@task(name="analyses", cache_policy=NONE, retries=3, task_run_name="analyses-{run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def store_analyses(warehouse: Warehouse, experiment_id: str, run_id: str, round_: int) -> AnalysesStored:
    """After ``run_id``'s round ``round_`` is committed: store the τ fits and paired tests of the
    experiment that are missing (this round's, and the pairs it completes; ``warehouse.analyses``)."""
    from warehouse.analyses import refresh  # scipy: only once a round is stored

    start = time.perf_counter()
    written = refresh(warehouse, [experiment_id])
    return AnalysesStored(written["tau_fits"], written["paired_tests"], time.perf_counter() - start)


# ------------------------------------------------------------------------------ personas
def personas_identity(warehouse: Warehouse, experiment_id: str) -> str | None:
    """What ties a stored population to its file: the file's resolved path and the experiment's
    first ``created_at`` (a deleted or replaced file gets another). None when the experiment is
    not recorded yet or the file cannot be read now."""
    try:
        created = warehouse.experiment_created_at(experiment_id)
    except (WarehouseError, duckdb.Error):
        return None
    return None if created is None else f"{warehouse.path.resolve()}|{created.isoformat()}"


def stored_personas(warehouse: Warehouse, experiment_id: str) -> int:
    """How many personas of the experiment are stored (0 for a new file)."""
    return warehouse.count_personas(experiment_id)


def store_personas(warehouse: Warehouse, experiment_id: str, personas: pl.DataFrame) -> int:
    """Store the experiment's personas once (validated); the rows written (0: stored already)."""
    return warehouse.write_personas(experiment_id, personas)


def read_personas(warehouse: Warehouse, experiment_id: str) -> pl.DataFrame:
    """The experiment's stored personas, by agent id."""
    return warehouse.read_personas(experiment_id)


def cached_backstories(warehouse: Warehouse, keys: pl.Series) -> pl.DataFrame:
    """The backstory cache's entries for these keys: ``key``, ``background`` (missing keys absent)."""
    return read_backstories(warehouse, keys)


def store_backstories(warehouse: Warehouse, rows: pl.DataFrame) -> int:
    """Add generated backstories to the cache (validated; stored keys skipped); the rows written."""
    return write_backstories(warehouse, rows)


# ------------------------------------------------------------------------------ what the UI and the report read
@dataclass(frozen=True)
class WorkerLoad:
    """A Ray worker's share of an experiment's shards: where it ran, its engine's model, shards and
    agents committed, and agents a second while busy (None: no busy time recorded)."""

    node: str
    worker: str
    engine: str
    shards: int
    agents: int
    agents_per_s: float | None


def workers(warehouse: Warehouse, experiment_id: str, since: datetime) -> list[WorkerLoad]:
    """The workers that committed shards of the experiment since ``since``, by node and worker."""
    frame = warehouse.worker_summary(experiment_id, since)
    return [
        WorkerLoad(r["node"], r["worker"], r["engine"], int(r["shards"]), int(r["agents"]), r["agents_per_s"])
        for r in frame.iter_rows(named=True)
    ]


def round_summary(warehouse: Warehouse, experiment_id: str) -> pl.DataFrame:
    """The experiment's ``round_summary`` view, by arm and round."""
    return warehouse.round_summary(experiment_id)
