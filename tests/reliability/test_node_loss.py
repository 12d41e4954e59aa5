"""Fault 2: a node removed mid-round from a local multi-node Ray cluster.

The cluster (``ray.cluster_utils.Cluster``) lives in a subprocess (tests/support/node_loss.py)
so it never mixes with the session's local Ray; the test reads what it recorded and the DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_node_removed_mid_round_loses_and_duplicates_nothing(tmp_path):
    db, out = tmp_path / "nodeloss.duckdb", tmp_path / "nodeloss.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.node_loss", str(db), str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    n, n_shards = r["n"], r["shards"]
    print(json.dumps({k: v for k, v in r.items() if k != "commits"}, indent=1))
    print([(c["shard"], c["node"][:8], c["worker"], round(c["t"] - r["removed"]["at"], 2)) for c in r["commits"]])

    # The node really went away mid-round, taking one actor's process with it.
    assert 3 <= r["removed"]["after_commits"] < n_shards
    assert r["victim_node"] not in r["alive_nodes"]
    assert r["before"][0]["node"] == r["victim_node"] and r["before"][1]["node"] != r["victim_node"]
    # The actor was restarted on the surviving node and played there.
    assert r["after"][0]["node"] != r["victim_node"] and r["after"][0]["pid"] != r["before"][0]["pid"]
    assert r["after"][0]["worker"] in {c["worker"] for c in r["commits"]}
    # Results that arrive well after the removal all come from the surviving node.
    late = [c for c in r["commits"] if c["t"] > r["removed"]["gone"] + 1.0]  # over a second after the node was gone
    assert late and all(c["node"] != r["victim_node"] for c in late)
    # Each shard committed once, with all its agents; nothing redone, nothing lost.
    assert sorted(c["shard"] for c in r["commits"]) == list(range(n_shards))
    assert all(c["written"] == c["sent"] for c in r["commits"])
    assert r["played"]["written"] == n
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*), count(distinct agent_id), count(*) filter (where valid) from guesses").fetchall() == [(n, n, n)]
        assert con.execute("select count(*), sum(n) from shards").fetchall() == [(n_shards, n)]
