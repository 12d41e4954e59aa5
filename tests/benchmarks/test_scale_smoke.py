"""The scale benchmark at 2,000 agents, end to end as users run it (no timing assertions)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import REPO
from tests.support.prefect_db import seed_home

N = 2_000


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    work = tmp_path_factory.mktemp("scale")
    # Its own Prefect API on a migrated database, as in a user's PREFECT_HOME after a first run.
    env = dict(os.environ, PREFECT_HOME=str(seed_home(work / "prefect", tmp_path_factory)))
    env.pop("RAY_ADDRESS", None)  # its own local Ray, as a user's run
    result = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--sizes", str(N), "--latencies", "1,0", "--warmup", "0",
         "--workdir", str(work), "--keep-db", "--json", str(work / "rows.json")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return work, result.stdout


@pytest.mark.slow
def test_table_has_a_row_per_latency_with_every_agent(bench):
    work, stdout = bench
    assert "keynes scale benchmark" in stdout
    for latency in ("1", "0"):
        assert re.search(rf"│\s+{N:,} │\s+{latency} │\s+[\d.]+ │\s+[\d,]+ │\s+[\d,]+ │\s+[\d.]+ │\s+1 │\s+{N:,} │", stdout), stdout
    assert re.search(r"settings: actors=\d+ .*concurrency=[\d,]+ requests per actor", stdout)
    rows = json.loads((work / "rows.json").read_text())
    assert [(r["agents"], r["latency_s"], r["rows"]) for r in rows] == [(N, 1.0, N), (N, 0.0, N)]
    assert all(r["wall_s"] > 0 and r["peak_mb"] > 0 and r["cpu_s"] > 0 for r in rows)
    # the flow stored each round's τ fits as the round landed, inside the wall time
    assert all(0 < r["analyses_s"] < r["wall_s"] for r in rows)
    # each run's report page is built after it, timed apart from the run
    assert all(r["report_s"] > 0 for r in rows)
    for latency in ("1", "0"):
        assert "<html" in (work / f"scale-{N}-{latency}-report.html").read_text()[:2000].lower()
    # the 1 s run waited for its simulated server at least once
    assert rows[0]["wall_s"] >= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("latency", ["1", "0"])
def test_duckdb_holds_exactly_one_guess_per_agent(bench, latency):
    work, _ = bench
    with duckdb.connect(str(work / f"scale-{N}-{latency}.duckdb"), read_only=True) as con:
        q = lambda sql: con.execute(sql).fetchall()[0]
        assert q("select count(*), count(distinct agent_id) from guesses") == (N, N)
        assert q("select count(*) from personas") == (N,)
        assert q("select sum(n) from shards") == (N,)
        assert q("select n, n_valid from rounds") == (N, N)
        assert q("select count(*) from guesses where not valid or guess < 0 or guess > 100") == (0,)
        assert q("select min(latency_s), max(latency_s) from guesses") == (float(latency), float(latency))
        assert q("select distinct engine, model from guesses") == ("simulated", "simulated/uniform")
