"""Fault 1: a Ray actor killed mid-round. The round still ends with exactly N guesses,
the in-flight shard is replayed on the restarted actor, committed shards are not redone.
"""

from __future__ import annotations

import os
import signal
import time

import duckdb
import polars as pl
import pytest

from core.game import GameRule
from design.arms import Arm
from engines.simulated import SimulatedSpec
from populations.sampler import sample
from populations.spec import load_spec
from tasks.play import play_round
from tasks.pool import IN_FLIGHT_PER_ACTOR, pool_for, shutdown_pools
from warehouse.store import Warehouse

N, SHARD, ACTORS = 400, 20, 2


class CountingWarehouse(Warehouse):
    """The real warehouse, remembering every commit as production makes it: one transaction
    per batch of shards that finished together (their shard numbers, rows new, rows sent).
    ``after_commit`` runs in the driver after each commit, before the driver goes on."""

    def __init__(self, path, after_commit=None):
        super().__init__(path)
        self.commits: list[tuple[list[int], int, int, float]] = []
        self.after_commit = after_commit

    def write_shards(self, shards):
        arrived = time.monotonic()  # when the driver got the shards' results
        new = super().write_shards(shards)
        self.commits.append(([shard.shard for shard in shards], new, sum(shard.guesses.height for shard in shards), arrived))
        if self.after_commit is not None:
            self.after_commit(self)
        return new

    @property
    def shards_committed(self) -> int:
        return sum(len(shards) for shards, _, _, _ in self.commits)


@pytest.fixture
def pools():
    """Shuts down the actor pools a test started, whether or not it passed: two 1-CPU actors
    left alive would hold the local Ray's 2 CPUs, and every later flow would wait for them."""
    yield
    shutdown_pools()


@pytest.mark.parametrize("how", ["ray.kill", "sigkill"])
def test_actor_killed_mid_round_loses_and_duplicates_nothing(how, db, local_ray, pools):
    import ray

    # Each shard takes ~0.6 s on the simulated engine: the round lasts ~6 s on 2 actors.
    spec = SimulatedSpec(latency_s=0.6, num_cpus=1)
    arm = Arm(0, "crash-arm0", spec, "basic", 0.7, GameRule(rounds=1))
    personas = sample(load_spec("education.yaml"), N, seed=3)
    pool = pool_for(spec, ACTORS)
    victim = pool.actors[0]
    before = ray.get([a.where.remote() for a in pool.actors])
    victim_pid = before[0]["pid"]
    killed: dict[str, float] = {}

    def kill_once_three_shards_are_committed(warehouse: CountingWarehouse) -> None:
        """In the driver, in the commit that brings the count to 3 or more: no other commit can
        happen before the kill, so it comes after 3 to 6 of the 20 shards (a commit holds at most
        the 4 shards in flight, ``IN_FLIGHT_PER_ACTOR`` per actor)."""
        if killed or warehouse.shards_committed < 3:
            return
        killed["after_commits"] = warehouse.shards_committed
        if how == "ray.kill":
            ray.kill(victim, no_restart=False)
        else:
            os.kill(victim_pid, signal.SIGKILL)
        killed["at"] = time.monotonic()

    warehouse = CountingWarehouse(db, after_commit=kill_once_three_shards_are_committed)
    played = play_round.fn(arm, 1, 11, personas, warehouse, ACTORS, SHARD)
    after = ray.get([a.where.remote() for a in pool.actors])

    # The actor really died mid-round and came back as a new process.
    assert 3 <= killed["after_commits"] <= 2 + ACTORS * IN_FLIGHT_PER_ACTOR
    assert after[0]["pid"] != victim_pid and after[1]["pid"] == before[1]["pid"]
    # Every shard committed exactly once, each with all of its agents: nothing redone.
    shards = [shard for batch, _, _, _ in warehouse.commits for shard in batch]
    assert sorted(shards) == list(range(N // SHARD))
    assert all(new == sent == SHARD * len(batch) for batch, new, sent, _ in warehouse.commits)
    assert played.written == N and played.shards == N // SHARD
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("select count(*), count(distinct agent_id), count(*) filter (where valid) from guesses").fetchall()
        assert rows == [(N, N, N)]
        assert con.execute("select count(*), sum(n) from shards").fetchall() == [(N // SHARD, N)]
        workers = pl.from_arrow(con.sql("select shard, worker, committed_at from shards order by shard").to_arrow_table())
    # The restarted actor (a new pid) played shards after the kill, the dead one none after it.
    victim_worker = before[0]["worker"]
    new_worker = after[0]["worker"]
    assert new_worker in set(workers["worker"])
    # Results that arrive well after the kill all come from live processes. Some do arrive that
    # late, whatever the machine's speed: at the kill at most 6 shards were committed and 4 in
    # flight, so 10 or more were not started, and each takes at least its 0.6 s on one of the two
    # actors: the last arrives 3 s or more after the kill.
    late = [shard for batch, _, _, t in warehouse.commits if t > killed["at"] + 1.0 for shard in batch]
    assert late, warehouse.commits
    late_workers = set(workers.filter(pl.col("shard").is_in(late))["worker"])
    assert victim_worker not in late_workers, (late, late_workers)


def test_a_pool_of_two_starts_without_a_ray_warning_and_its_board_is_found_by_name(local_ray, pools, capfd):
    """The pool's other actors find the first (the answer board's host, engines/shared_context/board.py) by its
    actor name. Given its handle among their constructor's arguments, Ray's core worker printed a
    warning into every run's output that such arguments sit in its object store, where an
    actor's restart may not find them."""
    import ray

    from tasks.actor import HostedBoard

    pool = pool_for(SimulatedSpec(num_cpus=1), ACTORS)
    assert len(ray.get([a.where.remote() for a in pool.actors])) == ACTORS
    assert pool.board is not None and HostedBoard(pool.board).claim(0, "prompt") is True
    assert HostedBoard(pool.board).claim(1, "prompt") is False  # the first actor's board: one grant
    printed = capfd.readouterr()
    assert "constructor arguments" not in printed.err + printed.out, printed.err
