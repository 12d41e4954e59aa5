"""Workers on a cluster: the flow joins a multi-node Ray cluster through `workers.ray_address`
and its shards run on more than one node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.conftest import REPO
from tests.support.sql import q

pytestmark = pytest.mark.slow

#: On a busy shared machine Ray's Python agents can take longer than the raylet's default
#: wait to register (the raylet then aborts): give them time.
SLOW_MACHINE = {"RAY_agent_register_timeout_ms": "120000"}

# Runs in its own process: this test process may already be attached to the session's
# local Ray, and a process joins one Ray only.
SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    from ray.cluster_utils import Cluster

    db = sys.argv[1]
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        from flows.experiment import experiment

        config = {
            "name": "cluster",
            "seed": 9,
            "population": {"spec": "education.yaml", "size": 200},
            "game": {"rounds": 2},
            "workers": {"actors": 4, "shard_size": 20},
            "report": {"enabled": False},
        }
        summary = experiment(config, overrides=[f"workers.ray_address={cluster.address}"], db=db)
        print("SUMMARY " + json.dumps({"summary": dataclasses.asdict(summary), "address": cluster.address,
                                        "nodes": [n.node_id for n in cluster.list_all_nodes()]}))
    finally:
        import ray
        ray.shutdown()
        cluster.shutdown()
    """
)


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory, prefect_api):
    from prefect.settings import PREFECT_API_URL

    db = tmp_path_factory.mktemp("cluster") / "cluster.duckdb"
    ray_tmp = tempfile.mkdtemp(prefix="kray-")  # short socket paths, and our own cluster registry
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "disabled",
           **SLOW_MACHINE}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(db)], env=env, cwd=REPO, capture_output=True, text=True, timeout=420
    )
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("SUMMARY "))
    return db, json.loads(line.removeprefix("SUMMARY "))



def test_the_flow_joins_the_cluster_and_plays_everything(cluster_run):
    db, out = cluster_run
    # The flow's summary, as dataclasses.asdict gives it (each arm's rows_written; the total is a property).
    assert sum(arm["rows_written"] for arm in out["summary"]["rounds"].values()) == 200 * 2 and out["summary"]["complete"] is True
    assert q(db, "select count(*), count(distinct agent_id) from guesses") == [(400, 200)]
    assert q(db, "select count(*) from rounds") == [(2,)]


def test_shards_ran_on_more_than_one_node(cluster_run):
    db, out = cluster_run
    nodes = {row[0] for row in q(db, "select distinct node from shards")}
    assert len(nodes) >= 2
    assert nodes <= set(out["nodes"])  # the cluster's own nodes, not some other Ray
    assert q(db, "select count(*) from shards") == [(10 * 2,)]


def test_the_workers_table_lists_each_node(cluster_run):
    from datetime import datetime, timezone

    from flows.monitor import worker_rows

    db, out = cluster_run
    from warehouse.store import Warehouse

    rows = worker_rows(Warehouse(db), q(db, "select experiment_id from experiments")[0][0], datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert len({r["node"] for r in rows}) >= 2
    assert sum(r["shards"] for r in rows) == 20 and sum(r["agents"] for r in rows) == 400
    assert all(r["engine"] == "simulated/uniform" and r["agents/s"] > 0 for r in rows)
