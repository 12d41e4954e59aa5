"""Stage 2, play: cut the population into shards and play them on a pool of Ray actors.

Each actor owns one engine (a model loads once per actor and serves every round).
Shards of a round run in parallel across actors; finished shards are committed to
the warehouse as soon as they arrive (those that arrive together in one transaction),
through the store stage (``tasks.store``: ``stored_round`` before, ``commit_shards`` during),
so an interrupted round resumes with only the missing agents. Actors restart after a
crash and Ray retries their shard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from design.arms import Arm
from design.seen import seen
from design.shards import pool_size
from engines import Constraint, EngineSpec
from engines.mixture import MixtureSpec, shard_index
from engines.shared_context import applies
from prompts.context import prompt_columns
from tasks import progress
from tasks.actor import ShardJob, ShardResult
from tasks.pool import check_resources, pool_for, run_pools
from tasks.retries import ON_TRANSIENT_ERRORS
from tasks.store import Warehouse, commit_shards, stored_round

__all__ = ["PlayedRound", "answer_ahead", "play_round"]


@dataclass(frozen=True)
class PlayedRound:
    """What ``play_round`` did: the population's agents, the shards it played (those with an
    agent not stored yet), the guesses it wrote, and its wall time."""

    agents: int
    shards: int
    written: int
    elapsed_s: float


@task(name="play", cache_policy=NONE, retries=3, task_run_name="play-{arm.run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def play_round(
    arm: Arm,
    round_: int,
    seed: int,
    personas: pl.DataFrame,
    warehouse: Warehouse,
    actors: int,
    shard_size: int,
) -> PlayedRound:
    """Play one round of one arm: every agent whose guess is not stored yet.

    Shards are numbered by position in the population (agent index // shard_size), so a
    resumed round re-plays only shards with missing agents and skips stored rows. Shards
    are committed as they finish (``tasks.store.commit_shards``), those that finish
    together in one transaction.
    """
    start = time.perf_counter()
    n = personas.height
    done, agents, shared = _round_inputs(arm, round_, personas, warehouse)
    specs, component, actor_counts = _components(arm, personas, seed, actors)
    index = shard_index(component, shard_size)
    # No more actors than an engine has shards in a round: each actor is a process that
    # imports the engine stack, which dominates a small run's wall time on a small machine.
    # (Counted on the whole population, so every round and resume uses one pool.)
    actor_counts = [min(a, int(np.unique(index[component == c]).size)) for c, a in enumerate(actor_counts)]
    frame = agents.with_columns(_shard=pl.Series(index, dtype=pl.Int32), _component=pl.Series(component, dtype=pl.Int32))
    if len(done):
        frame = frame.filter(~pl.col("agent_id").is_in(pl.Series(done)))
    parts = frame.partition_by("_shard", as_dict=True, maintain_order=True).items()
    jobs = [(int(part["_component"][0]), ShardJob(arm, seed, round_, int(shard), part.drop("_shard", "_component"), shared)) for (shard,), part in parts]
    written = 0
    bar = progress.current().start(f"{arm.run_id} round {round_}", total=n, completed=len(done))

    def commit(finished: list[tuple[ShardJob, ShardResult]]) -> None:
        nonlocal written
        written += commit_shards(warehouse, finished)
        bar.advance(sum(job.agents.height for job, _ in finished))

    if jobs:
        used = sorted({c for c, _ in jobs})
        check_resources([specs[c] for c in used], [actor_counts[c] for c in used])
        run_pools([(pool_for(specs[c], actor_counts[c]), [j for k, j in jobs if k == c]) for c in used], commit)
    bar.finish()
    return PlayedRound(n, len(jobs), written, time.perf_counter() - start)


#: Round 1's distinct prompts answered ahead of its shards, at most: more would hold up the
#: first shard (each actor answers them before it plays).
AHEAD_MAX = 64


def answer_ahead(arm: Arm, seed: int, personas: pl.DataFrame, warehouse: Warehouse, actors: int, shard_size: int) -> int:
    """Hand round 1's distinct prompts to the arm's actors now, ahead of its shards.

    With shared-context answers every shard of round 1 holds the same few persona prompts; the
    actors (their engines loaded while the flow writes its rows) compute their distributions
    between them (``engines.shared_context.board``) and keep them, so the first shards only draw. The prompts
    are the round's own (the same inputs as ``play_round``), so no guess changes. Only a plain
    engine that keeps distributions, direct answers, at most ``AHEAD_MAX`` distinct prompts.
    Returns how many were handed over (0: none).
    """
    engine = arm.engine
    rule = arm.rule
    if arm.mode.reasoning or not isinstance(engine, EngineSpec) or not engine.uses_shared_context:
        return 0
    if not applies(Constraint(rule.low, rule.high, rule.integer)):
        return 0
    done, agents, shared = _round_inputs(arm, 1, personas, warehouse)
    attributes, play = prompt_columns(agents.columns)
    columns = attributes + play
    distinct = agents.select(columns).unique(maintain_order=True)
    if not columns or len(done) == personas.height or distinct.height > AHEAD_MAX:
        return 0
    job = ShardJob(arm, seed, 1, -1, distinct.with_row_index("agent_id").with_columns(pl.col("agent_id").cast(pl.Int64)), shared)
    pool_for(engine, pool_size(personas.height, actors, shard_size)).answer_ahead(job)
    return distinct.height


def _round_inputs(arm: Arm, round_: int, personas: pl.DataFrame, warehouse: Warehouse) -> tuple[Any, pl.DataFrame, dict[str, Any]]:
    """What round ``round_`` is played from: the agents already stored, every agent's variables
    (persona, the own guesses ``game.history`` shows) and the round's shared variables."""
    # Nested environments: each agent is told its group's results.
    stored = stored_round(warehouse, arm.run_id, round_, grouped="group" in personas.columns)
    shared, agents = seen(arm.rule, personas, round_, stored.history, own_guesses=stored.own_guesses, group_history=stored.group_history)
    return stored.done, agents, shared


def _components(arm: Arm, personas: pl.DataFrame, seed: int, actors: int) -> tuple[list[EngineSpec], np.ndarray, list[int]]:
    """The engines of an arm, each agent's engine index, and actors per engine.

    A plain engine plays everyone on ``actors`` actors; a mixture splits the agents by
    quota (the same split every round) and the actors by fraction.
    """
    n = personas.height
    if isinstance(arm.engine, MixtureSpec):
        component = arm.engine.assign(personas["agent_id"].to_numpy(), seed)
        return [c.engine for c in arm.engine.components], component, arm.engine.actors(actors)
    return [arm.engine], np.zeros(n, np.int64), [actors]
