"""Readers (`keynes sql`) run while `keynes run` writes the same file, without errors."""

from __future__ import annotations

import subprocess
import sys
import time

import duckdb
import pytest

from tests.conftest import REPO
from tests.support.sql import held_when

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
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, "KEYNES_LOCK_TIMEOUT_S": "600"},  # its commits wait for the readers below: give them time
    )
    counts: list[int] = []
    failures: list[str] = []
    total = SIZE * ROUNDS * 2  # two prompt modes in the quickstart
    held: list[tuple[int, int]] = []  # (guesses committed while a reader ran, what the reader counted)

    def sql_reader() -> None:
        reader = subprocess.run(
            [sys.executable, "-m", "cli.app", "sql", "--db", str(db), "--format", "csv",
             "select (select count(*) from guesses) as n, (select count(*) from round_summary) as r"],
            cwd=REPO, capture_output=True, text=True, timeout=300,
        )
        if reader.returncode != 0:
            failures.append(reader.stderr)
        else:
            counts.append(int(reader.stdout.splitlines()[1].split(",")[0]))

    def mid_run(after: int):
        def ready(n: int) -> bool:
            assert n < total and writer.poll() is None, f"the run ended before reader {len(held) + 1} could look ({n} guesses)"
            return n > after
        return ready

    try:
        # Three readers mid-run, whatever the machine's speed: each starts once more guesses are
        # committed than the last one saw, while this process holds the file, so the writer's next
        # commit waits for the reader to finish (its lock timeout is raised above).
        for _ in range(3):
            with held_when(db, "select count(*) from guesses", mid_run(held[-1][0] if held else 0), 600,
                           "more guesses committed") as committed:
                sql_reader()
                held.append((committed, counts[-1] if counts else -1))
        deadline = time.monotonic() + 900
        while writer.poll() is None and time.monotonic() < deadline:
            sql_reader()
            time.sleep(0.5)  # each reader is a whole `keynes sql` process: leave the writer the CPU
        out, err = writer.communicate(timeout=300)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err[-2000:]
    assert not failures, failures[:2]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("select count(*) from guesses").fetchall() == [(total,)]
    # Three readers saw the file while it grew, each exactly what was committed when it ran,
    # each more than the one before.
    during = [c for c in counts if 0 < c < total]
    assert len(during) >= 3, counts
    assert [seen for _, seen in held] == [committed for committed, _ in held], held
    assert [c for c, _ in held] == sorted({c for c, _ in held}), held
    # And all of them (those after the three, as often as the machine allows): whole shards only,
    # never a count that went back, never more than the final one.
    assert all(c % SHARD == 0 for c in counts), counts
    assert counts == sorted(counts) and counts[-1] <= total, counts
