"""Play one round on a local multi-node Ray cluster and remove a node mid-round.

Run as ``python -m tests.support.node_loss DB OUT.json``: it starts a head node (no CPUs,
only the driver) and two worker nodes with ``ray.cluster_utils.Cluster``, plays a
simulated round of N agents with one actor per worker node, removes the node of one
actor after three shards are committed, and writes what happened to OUT.json. It runs
in its own process so the cluster never mixes with a test session's local Ray.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import asdict

from cli.runtime import settings

# keynes's process settings (workers share this interpreter, Ray on loopback), before Ray is imported.
settings.apply({"RAY_AUTH_MODE": "disabled"})

import ray
from ray.cluster_utils import Cluster

from core.game import GameRule
from design.arms import Arm
from engines.simulated import SimulatedSpec
from populations.sampler import sample
from populations.spec import load_spec
from tasks.play import play_round
from tasks.pool import LOOPBACK, pool_for, shutdown_pools
from warehouse.store import Warehouse

N, SHARD, ACTORS = 400, 20, 2

# Detect a lost node in ~1.5 s instead of the default ~15 s.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500, "health_check_failure_threshold": 3}


class CountingWarehouse(Warehouse):
    """The real warehouse, remembering every shard commit."""

    commits: list[dict]

    def write_shards(self, shards):
        arrived = time.monotonic()  # when the driver got the shards' results
        written = 0
        for shard in shards:  # one at a time, to count each shard's new rows
            new = super().write_shards([shard])
            self.commits.append({"shard": shard.shard, "written": new, "sent": shard.guesses.height,
                                 "worker": shard.worker, "node": shard.node, "t": arrived})
            written += new
        return written


def main(db: str, out: str) -> None:
    cluster = Cluster(  # every node on 127.0.0.1: this machine only
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "node_ip_address": LOOPBACK,
                        "_system_config": FAST_HEALTH_CHECKS},
    )
    workers = [cluster.add_node(num_cpus=2, node_ip_address=LOOPBACK) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        spec = SimulatedSpec(latency_s=0.6, num_cpus=1)
        arm = Arm(0, "nodeloss-arm0", spec, "basic", 0.7, GameRule(rounds=1))
        personas = sample(load_spec("education.yaml"), N, seed=5)
        warehouse = CountingWarehouse(db)
        warehouse.commits = []
        pool = pool_for(spec, ACTORS)
        before = ray.get([a.where.remote() for a in pool.actors])
        victim_node = next(n for n in workers if n.node_id == before[0]["node"])
        removed: dict = {}

        def remove_when_three_shards_are_committed() -> None:
            deadline = time.monotonic() + 120
            while len(warehouse.commits) < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            removed.update(after_commits=len(warehouse.commits), at=time.monotonic())
            cluster.remove_node(victim_node, allow_graceful=False)
            # Removing a node waits for its processes to end (seconds on a busy machine): results
            # the victim sent before it was gone may still arrive until then.
            removed.update(gone=time.monotonic())

        remover = threading.Thread(target=remove_when_three_shards_are_committed)
        remover.start()
        start = time.monotonic()
        played = play_round.fn(arm, 1, 11, personas, warehouse, ACTORS, SHARD)
        remover.join()
        after = ray.get([a.where.remote() for a in pool.actors])
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        shutdown_pools()
        result = {
            "n": N, "shards": N // SHARD, "played": asdict(played), "before": before, "after": after,
            "victim_node": victim_node.node_id, "alive_nodes": alive, "removed": removed,
            "commits": warehouse.commits, "seconds": time.monotonic() - start,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
