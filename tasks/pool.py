"""The Ray worker pool: actors that each own one engine, kept for an experiment's rounds.

``ensure_ray`` joins a cluster or starts a local Ray (listening on 127.0.0.1 only);
``pool_for`` gives the pool of an engine spec (created on first use, so a model loads once
per actor and serves every round); ``run_pools`` plays jobs on several pools at once with
a group-commit callback. The play stage and the personas stage (backstories) both use it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import subprocess
import threading
import uuid
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import ray

from design.arms import Arm
from design.shards import pool_size
from engines import EngineSpec
from engines.mixture import MixtureSpec
from tasks import kept
from tasks.actor import AgentWorker, ShardJob, ShardResult  # defined without Prefect so actors start fast
from tasks.limits import ensure_shared
from tasks.ray_internals import monitor_processes, sigterm_handler_kept
from tasks.timings import mark

__all__ = ["LOOPBACK", "WorkerPool", "check_resources", "ensure_ray", "pool_for", "run_pools", "shutdown_pools", "stop_ray", "warm_pool"]

log = logging.getLogger(__name__)

#: Shards in flight per actor: one playing, one queued so the actor never waits for data.
IN_FLIGHT_PER_ACTOR = 2


@dataclass(frozen=True)
class RayCluster:
    """What ``ensure_ray`` learned when it connected: the cluster's address (the GCS, or None when
    Ray did not say) and its dashboard's URL (None without a dashboard)."""

    address: str | None = None
    dashboard_url: str | None = None


#: The Ray this process joined: kept per process because Ray's connection is per process
#: (``ray.init`` once, ``ray.is_initialized`` after) and says neither.
_RAY = RayCluster()

#: The address a local Ray's node has, and so every server of it listens on: this machine only.
#: ``ray.cluster_utils.Cluster`` nodes take it as ``node_ip_address``.
LOOPBACK = "127.0.0.1"


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Around ``ray.init``: a SIGTERM or Ctrl-C is noted, then handed to the caller's handler once
    Ray is up.

    ``ray.init`` makes SIGTERM a bare ``sys.exit`` in the driver, and it starts Ray's processes;
    an exception raised by a signal handler while Python runs an at-fork callback of one of
    those starts is dropped ("Exception ignored in: <function _releaseLock>"), and the signal
    with it, and the run would go on as if nothing had been sent. So the caller's SIGTERM handler
    is kept after ``ray.init`` (the flow's: the run ends as interrupted, as on Ctrl-C; under
    ``keynes run`` before the flow, the default: the process ends).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    callers = {signum: signal.getsignal(signum) for signum in held}
    noted: list[int] = []
    for signum in held:
        signal.signal(signum, lambda signum, frame: noted.append(signum))
    try:
        with sigterm_handler_kept():  # ray.init's own: keep ours while it runs
            yield
    finally:
        for signum, handler in callers.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(noted):  # delivered again, now that the caller's handlers are back
            os.kill(os.getpid(), signum)


def ensure_ray(address: str | None = None, dashboard: bool = False, num_cpus: int | None = None,
               joining: dict[str, Any] | None = None) -> RayCluster:
    """Join a Ray cluster (``address``) or start a local Ray; idempotent.

    Returns what is known of the cluster (``RayCluster``).
    ``joining``: further ``ray.init`` arguments (a warm stack's: its job's namespace, and the
    command's environment for its workers: cli/runtime/stack.py).
    A local Ray gets the machine's CPU count unless ``num_cpus`` says otherwise, and listens
    on 127.0.0.1 only: its node address is loopback when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    was set before Ray was imported (``cli.runtime.settings.apply`` sets it); otherwise a warning
    says that it listens on every interface.
    """
    global _RAY
    if not ray.is_initialized():
        # Ray 2.60 turns on token authentication by default; a local Ray on this machine
        # needs none (set RAY_AUTH_MODE yourself to keep it).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "logging_level": logging.WARNING}
        kwargs.update(joining or {})
        if address:
            kwargs["address"] = address
        else:
            # "local": a new Ray of our own, never a cluster someone else started on this machine.
            kwargs["address"] = "local"
            kwargs["num_cpus"] = num_cpus or os.cpu_count() or 2
            kwargs["include_dashboard"] = dashboard
            kwargs["dashboard_host"] = LOOPBACK
            kwargs["object_store_memory"] = 1 << 30
        mark("ray: starting")
        with _signals_deferred():
            context = ray.init(**kwargs)
        mark("ray: started")
        node = context.address_info.get("node_ip_address") or LOOPBACK
        if not address and not ipaddress.ip_address(node).is_loopback:
            log.warning("the local Ray listens on %s, reachable from other machines: set "
                        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray is imported to keep it on 127.0.0.1", node)
        _RAY = RayCluster(context.address_info.get("address"), context.dashboard_url or None)
    return _RAY


def stop_ray() -> None:
    """``ray.shutdown``, a second sooner when this driver started the local Ray.

    Ray stops its processes one after the other, each with SIGTERM and up to a second's grace:
    the GCS goes before the autoscaler's monitor, whose SIGTERM handler then tries to write its
    own failure to that GCS and is killed at the end of its second. A local Ray autoscales
    nothing, so its monitor is killed first, quietly; Ray then finds it gone. A driver that
    joined a cluster started none of its processes and only disconnects.
    """
    if not ray.is_initialized():
        return
    for process in monitor_processes():  # none when it joined a cluster
        if process.poll() is None:
            process.kill()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
    ray.shutdown()


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
        # In a warm stack the pool is kept for the next command, its actors named after the spec
        # (tasks/kept.py); a kept pool of the same name is found instead of started.
        self.kept = kept.keeps(spec)
        names: list[dict[str, Any]] = [{} for _ in range(actors)]
        if self.kept:
            kept.lease()
            names = [{"name": kept.name(spec, actors, i), "lifetime": "detached", "get_if_exists": True} for i in range(actors)]
            kept.evict({n["name"] for n in names} | {a for pool in _POOLS.values() for a in pool.names})
        self.names = [n.get("name") for n in names]
        # The first actor holds the pool's answer board (engines.shared_context.board): each distinct prompt's
        # distribution is computed by one actor of the pool. The others find it by its name (an
        # actor handle among their constructor's arguments would make Ray keep those in its
        # object store, where a restart may not find them).
        self.board = (self.names[0] or f"keynes-answers-{uuid.uuid4().hex[:12]}") if actors > 1 else None
        first = AgentWorker.options(**options, **(names[0] if self.kept else {"name": self.board} if self.board else {})).remote(spec, 0, actors)
        self.actors = [first, *(AgentWorker.options(**options, **names[i]).remote(spec, i, actors, self.board) for i in range(1, actors))]
        mark(f"pool: {actors} actor(s) requested{' (kept warm)' if self.kept else ''}")

    def answer_ahead(self, job: ShardJob) -> None:
        """Have every actor answer ``job`` before its next shard, for the answer distributions its
        engine keeps (``tasks.play.answer_ahead``); not waited for (each actor plays its shards after)."""
        for actor in self.actors:
            actor.answer_ahead.remote(job)

    def run(self, jobs: list[Any], on_done: Callable[[list[tuple[Any, Any]]], None], method: str = "play") -> None:
        """Play every job (or pass each to the actors' ``method``), calling ``on_done`` in
        the driver with the (job, result) pairs that finished since its last call."""
        run_pools([(self, jobs)], on_done, method)

    def shutdown(self, close_timeout_s: float = 10.0) -> None:
        """Close every actor's engine (briefly: a hung engine does not hold up the run), then kill it.
        A kept pool is left running, its model loaded, for the next command (tasks/kept.py)."""
        if self.kept:
            self.actors = []
            return
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


#: The driver's pools by engine and size, kept across rounds and arms until ``shutdown_pools``: a
#: pool's actors belong to this driver process (they die with it), so the process owns the pools.
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
    pool_for(arm.engine, pool_size(agents, actors, shard_size))


def shutdown_pools() -> None:
    """Kill every actor of every pool (the engines with them)."""
    for pool in _POOLS.values():
        pool.shutdown()
    _POOLS.clear()


def check_resources(specs: list[EngineSpec], actors: list[int]) -> None:
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
