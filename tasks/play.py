"""Stage 2, play: cut the population into shards and play them on a pool of Ray actors.

Each actor owns one engine (a model loads once per actor and serves every round).
Shards of a round run in parallel across actors; each finished shard is committed
to the warehouse as soon as it arrives, so an interrupted round resumes with only
the missing agents. Actors restart after a crash and Ray retries their shard.
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

from tasks import progress
from tasks.engines import EngineSpec
from tasks.worker import Arm, ShardJob, ShardPlayer, ShardResult, game_context
from warehouse.store import Warehouse

__all__ = ["Arm", "WorkerPool", "ensure_ray", "play_round", "shutdown_pools"]

log = logging.getLogger(__name__)

#: Shards in flight per actor: one playing, one queued so the actor never waits for data.
IN_FLIGHT_PER_ACTOR = 2


@ray.remote
class AgentWorker:
    """A Ray actor that owns one engine and plays shards with it."""

    def __init__(self, spec: EngineSpec):
        self.player = ShardPlayer(spec)
        self.node = ray.get_runtime_context().get_node_id()

    def play(self, job: ShardJob) -> ShardResult:
        return self.player.play(job, node=self.node)

    def where(self) -> dict[str, Any]:
        return {"node": self.node, "worker": self.player.worker, "pid": os.getpid()}


_RAY: dict[str, Any] = {}


def ensure_ray(address: str | None = None, dashboard: bool = False, num_cpus: int | None = None) -> dict[str, Any]:
    """Join a Ray cluster (``address``) or start a local Ray; idempotent.

    Returns what is known of the cluster: ``address`` and ``dashboard_url`` (or None).
    """
    if not ray.is_initialized():
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "logging_level": logging.WARNING}
        if address:
            kwargs["address"] = address
        else:
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
        self.actors = [AgentWorker.options(**options).remote(spec) for _ in range(actors)]

    def run(self, jobs: list[ShardJob], on_result: Callable[[ShardJob, ShardResult], None]) -> None:
        """Play every job, calling ``on_result`` in the driver as each shard finishes."""
        pending = deque(jobs)
        running: dict[ray.ObjectRef, tuple[ShardJob, Any]] = {}
        load = {i: 0 for i in range(len(self.actors))}

        def submit() -> None:
            while pending:
                index = min(load, key=load.get)
                if load[index] >= IN_FLIGHT_PER_ACTOR:
                    return
                job = pending.popleft()
                running[self.actors[index].play.remote(job)] = (job, index)
                load[index] += 1

        submit()
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            ref = done[0]
            job, index = running.pop(ref)
            load[index] -= 1
            result = ray.get(ref)
            on_result(job, result)
            submit()

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []


_POOLS: dict[str, WorkerPool] = {}


def pool_for(spec: EngineSpec, actors: int) -> WorkerPool:
    """The pool for this engine spec, created on first use and kept for later rounds."""
    key = f"{spec.key}:{actors}"
    if key not in _POOLS:
        _POOLS[key] = WorkerPool(spec, actors)
    return _POOLS[key]


def shutdown_pools() -> None:
    """Kill every actor of every pool (the engines with them)."""
    for pool in _POOLS.values():
        pool.shutdown()
    _POOLS.clear()


def shard_agents(agent_ids: np.ndarray, shard_size: int) -> list[np.ndarray]:
    """Cut sorted agent ids into shards of ``shard_size`` by position in the population."""
    return [agent_ids[i : i + shard_size] for i in range(0, len(agent_ids), shard_size)]


@task(name="play", cache_policy=NONE, retries=2, retry_delay_seconds=[2, 10], task_run_name="play-{arm.run_id}-round-{round_}")
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
    resumed round re-plays only shards with missing agents and skips stored rows.
    Returns counts: agents, shards played, rows written, seconds.
    """
    start = time.perf_counter()
    n = personas.height
    done = warehouse.committed_agents(arm.run_id, round_)
    agents = personas
    if round_ > 1:
        own = warehouse.own_guesses(arm.run_id, round_)
        agents = agents.join(own, on="agent_id", how="left")
    history = warehouse.history(arm.run_id, round_)
    shared = {"game": game_context(arm.rule, n), "round": round_, "history": history}
    index = np.arange(n) // shard_size
    frame = agents.with_columns(_shard=pl.Series(index, dtype=pl.Int32))
    if len(done):
        frame = frame.filter(~pl.col("agent_id").is_in(pl.Series(done)))
    jobs = [
        ShardJob(arm, seed, round_, int(shard), part.drop("_shard"), shared)
        for (shard,), part in frame.partition_by("_shard", as_dict=True, maintain_order=True).items()
    ]
    written = 0
    bar = progress.current().start(f"{arm.run_id} round {round_}", total=n, completed=len(done))

    def commit(job: ShardJob, result: ShardResult) -> None:
        nonlocal written
        written += warehouse.write_shard(
            result.guesses,
            {"run_id": arm.run_id, "round": round_, "shard": job.shard, "n": job.agents.height,
             "node": result.node, "worker": result.worker, "seconds": result.seconds},
        )
        bar.advance(job.agents.height)

    if jobs:
        pool = pool_for(arm.engine, actors)
        pool.run(jobs, commit)
    bar.finish()
    return {"agents": n, "shards": len(jobs), "written": written, "seconds": time.perf_counter() - start}
