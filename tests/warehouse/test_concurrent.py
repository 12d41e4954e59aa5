"""Readers (`keynes sql`) run while `keynes run` writes the same file, without errors."""

from __future__ import annotations

import subprocess
import sys
import time

import duckdb
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # the simulated engine only: no model, but a whole `keynes run` subprocess and its readers

SIZE, ROUNDS, SHARD = 2000, 3, 100


def test_sql_readers_run_while_an_experiment_writes(tmp_path, session_cli):
    env, ray_address = session_cli  # the writer joins the session's Prefect API and Ray: reading is the point
    db = tmp_path / "busy.duckdb"
    writer = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "run", str(REPO / "experiments/quickstart.yaml"), "--db", str(db),
         "--set", f"population.size={SIZE}", "--set", f"game.rounds={ROUNDS}", "--set", f"workers.shard_size={SHARD}",
         "--set", "arms.engines=[{kind: simulated, latency_s: 0.05, concurrency: 50}]", "--set", "report.enabled=false",
         "--set", f"workers.ray_address={ray_address}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    counts: list[int] = []
    failures: list[str] = []
    try:
        deadline = time.monotonic() + 900
        while writer.poll() is None and time.monotonic() < deadline:
            if not db.exists():
                time.sleep(0.5)
                continue
            reader = subprocess.run(
                [sys.executable, "-m", "cli.app", "sql", "--db", str(db), "--format", "csv",
                 "select (select count(*) from guesses) as n, (select count(*) from round_summary) as r"],
                cwd=REPO, capture_output=True, text=True, timeout=300,
            )
            if reader.returncode != 0:
                failures.append(reader.stderr)
            else:
                counts.append(int(reader.stdout.splitlines()[1].split(",")[0]))
            time.sleep(0.5)  # each reader is a whole `keynes sql` process: leave the writer the CPU
        out, err = writer.communicate(timeout=300)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err[-2000:]
    assert not failures, failures[:2]
    total = SIZE * ROUNDS * 2  # two prompt modes in the quickstart
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from guesses").fetchall() == [(total,)]
    # Readers ran while the file grew (how often, and what they saw, depends on the machine's
    # speed): whole shards only, never a count that went back, never more than the final one.
    assert counts, "no reader was started while the run wrote"
    assert all(c % SHARD == 0 for c in counts), counts
    assert counts == sorted(counts) and counts[-1] <= total, counts
