"""Stage 2, play: cut the population into shards and play them on a pool of Ray actors.

Each actor owns one engine (a model loads once per actor and serves every round).
Shards of a round run in parallel across actors; finished shards are committed to
the warehouse as soon as they arrive (those that arrive together in one transaction),
so an interrupted round resumes with only the missing agents. Actors restart after a
crash and Ray retries their shard.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import polars as pl
import ray
from prefect import task
from prefect.cache_policies import NONE

from core.arms import Arm
from engines import EngineSpec
from engines.limits import ensure_shared
from engines.mixture import MixtureSpec, shard_index
from prompts.context import game_context, groups_context, population_context
from tasks import progress
from tasks.actor import AgentWorker, ShardJob, ShardResult  # defined without Prefect so actors start fast
from tasks.retries import ON_TRANSIENT_ERRORS
from tasks.store import commit_shards
from warehouse.store import Warehouse

__all__ = ["WorkerPool", "ensure_ray", "play_round", "run_pools", "shutdown_pools", "warm_pool"]

log = logging.getLogger(__name__)

#: Shards in flight per actor: one playing, one queued so the actor never waits for data.
IN_FLIGHT_PER_ACTOR = 2


_RAY: dict[str, Any] = {}


def ensure_ray(address: str | None = None, dashboard: bool = False, num_cpus: int | None = None) -> dict[str, Any]:
    """Join a Ray cluster (``address``) or start a local Ray; idempotent.

    Returns what is known of the cluster: ``address`` and ``dashboard_url`` (or None).
    A local Ray gets the machine's CPU count unless ``num_cpus`` says otherwise.
    """
    if not ray.is_initialized():
        # Ray 2.60 turns on token authentication by default; a local Ray on this machine
        # needs none (set RAY_AUTH_MODE yourself to keep it).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "logging_level": logging.WARNING}
        if address:
            kwargs["address"] = address
        else:
            # "local": a new Ray of our own, never a cluster someone else started on this machine.
            kwargs["address"] = "local"
            kwargs["num_cpus"] = num_cpus or os.cpu_count() or 2
            kwargs["include_dashboard"] = dashboard
            kwargs["object_store_memory"] = 1 << 30
        context = ray.init(**kwargs)
        _RAY.update(address=context.address_info.get("address"), dashboard_url=context.dashboard_url or None)
    return dict(_RAY)


class WorkerPool:
    """A fixed pool of ``AgentWorker`` actors for one engine spec."""

    def __init__(self, spec: EngineSpec, actors: int):
        self.spec = spec
        options = {
            "num_cpus": spec.num_cpus,
            "num_gpus": spec.num_gpus,
            "max_restarts": 3,
            "max_task_retries": 3,
            "scheduling_strategy": "SPREAD",
        }
        ensure_shared(spec)  # an engine's rate limits, shared by its actors, belong to this driver
        self.actors = [AgentWorker.options(**options).remote(spec) for _ in range(actors)]

    def run(self, jobs: list[Any], on_done: Callable[[list[tuple[Any, Any]]], None], method: str = "play") -> None:
        """Play every job (or pass each to the actors' ``method``), calling ``on_done`` in
        the driver with the (job, result) pairs that finished since its last call."""
        run_pools([(self, jobs)], on_done, method)

    def shutdown(self, close_timeout_s: float = 10.0) -> None:
        """Close every actor's engine (briefly: a hung engine does not hold up the run), then kill it."""
        try:
            ray.get([actor.close.remote() for actor in self.actors], timeout=close_timeout_s)
        except Exception as exc:  # a dead or hung actor is killed all the same
            log.debug("closing engines: %s", exc)
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


def run_pools(
    work: list[tuple[WorkerPool, list[ShardJob]]],
    on_done: Callable[[list[tuple[ShardJob, ShardResult]]], None],
    method: str = "play",
) -> None:
    """Play each pool's jobs on that pool, all pools at once (the engines of a mixture).

    ``on_done`` runs in the driver with every (job, result) that finished since its last
    call: while it commits one batch, the next accumulates (group commit), so the driver
    keeps up with any number of actors. Freed actors get new jobs before it is called.
    """
    queues = [(pool, deque(jobs), [0] * len(pool.actors)) for pool, jobs in work]
    running: dict[ray.ObjectRef, tuple[ShardJob, int, int]] = {}

    def submit() -> None:
        for p, (pool, pending, load) in enumerate(queues):
            while pending:
                index = min(range(len(load)), key=load.__getitem__)
                if load[index] >= IN_FLIGHT_PER_ACTOR:
                    break
                job = pending.popleft()
                running[getattr(pool.actors[index], method).remote(job)] = (job, p, index)
                load[index] += 1

    submit()
    while running:
        ray.wait(list(running), num_returns=1)
        ready, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
        results = ray.get(ready)
        finished = []
        for ref, result in zip(ready, results):
            job, p, index = running.pop(ref)
            queues[p][2][index] -= 1
            finished.append((job, result))
        submit()
        on_done(finished)


_POOLS: dict[str, WorkerPool] = {}


def pool_for(spec: EngineSpec, actors: int) -> WorkerPool:
    """The pool for this engine spec, created on first use and kept for later rounds."""
    key = f"{spec.key}:{actors}"
    if key not in _POOLS:
        _POOLS[key] = WorkerPool(spec, actors)
    return _POOLS[key]


def warm_pool(arm: Arm, agents: int, actors: int, shard_size: int) -> None:
    """Start the actors that will play ``arm`` now, so that their processes start (and
    load their engine) while the driver does other work; ``play_round`` finds them.

    Only for a plain engine, where the pool size is known from the population size
    alone (a mixture's depends on how the agents are split).
    """
    if isinstance(arm.engine, MixtureSpec) or agents <= 0:
        return
    pool_for(arm.engine, min(actors, -(-agents // shard_size)))


def shutdown_pools() -> None:
    """Kill every actor of every pool (the engines with them)."""
    for pool in _POOLS.values():
        pool.shutdown()
    _POOLS.clear()


@task(name="play", cache_policy=NONE, retries=3, task_run_name="play-{arm.run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def play_round(
    arm: Arm,
    round_: int,
    seed: int,
    personas: pl.DataFrame,
    warehouse: Warehouse,
    actors: int,
    shard_size: int,
) -> dict[str, Any]:
    """Play one round of one arm: every agent whose guess is not stored yet.

    Shards are numbered by position in the population (agent index // shard_size), so a
    resumed round re-plays only shards with missing agents and skips stored rows. Shards
    are committed as they finish (``tasks.store.commit_shards``), those that finish
    together in one transaction. Returns counts: agents, shards played, rows written, seconds.
    """
    start = time.perf_counter()
    n = personas.height
    done = warehouse.committed_agents(arm.run_id, round_)
    agents = personas
    if round_ > 1:
        own = warehouse.own_guesses(arm.run_id, round_)
        agents = agents.join(own, on="agent_id", how="left")
    history = warehouse.history(arm.run_id, round_)
    shared = {"game": game_context(arm.rule, n), "round": round_, "history": history, "population": population_context(personas)}
    if "group" in personas.columns:  # nested environments: each agent is told its group's results
        shared["groups"] = groups_context(personas, warehouse.group_history(arm.run_id, round_))
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
        _check_resources([specs[c] for c in used], [actor_counts[c] for c in used])
        run_pools([(pool_for(specs[c], actor_counts[c]), [j for k, j in jobs if k == c]) for c in used], commit)
    bar.finish()
    return {"agents": n, "shards": len(jobs), "written": written, "seconds": time.perf_counter() - start}


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


def _check_resources(specs: list[EngineSpec], actors: list[int]) -> None:
    """Engines of a mixture run at once: refuse, clearly, pools that can never all start."""
    if len(specs) < 2:
        return
    have = ray.cluster_resources()
    for resource, need in (("CPU", sum(s.num_cpus * a for s, a in zip(specs, actors))),
                           ("GPU", sum(s.num_gpus * a for s, a in zip(specs, actors)))):
        if need > have.get(resource, 0) + 1e-9:
            raise ValueError(
                f"arms.engines: the mixture's {sum(actors)} actors need {need:g} {resource}s at once and the Ray "
                f"cluster has {have.get(resource, 0):g}; lower workers.actors or the components' num_{resource.lower()}s"
            )
