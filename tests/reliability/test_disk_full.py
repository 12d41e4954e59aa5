"""A warehouse whose file system fills up mid-run: one line naming the file and the free space,
a file that still opens with whole shards only, and an exact resume once space is freed.

The warehouse lives on a small tmpfs (this machine runs tests as root) that a filler file fills
to about half of what the run needs; the run is compared row by row with an uninterrupted run of
the same config on the ordinary disk.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.requirements import needs
from tests.support.sql import q

# Without root: skipped on a developer's machine, failed under CI (which runs as root).
pytestmark = needs("root", os.geteuid() == 0, "mounting a tmpfs needs root (CI runs as root)")

N, SHARD = 20_000, 4_000
OVERRIDES = [f"population.size={N}", "game.rounds=4", "arms.engines=[{kind: simulated}]", "arms.prompts=[basic]",
             "report.enabled=false", f"workers.shard_size={SHARD}", "workers.actors=2"]
#: What a run stores, compared between the resumed and the uninterrupted run.
CONTENT = {
    "guesses": "select run_id, round, agent_id, shard, guess, valid, raw from guesses order by all",
    "rounds": "select run_id, round, n, n_valid, mean, median, target, winning_guess, n_winners from rounds order by all",
    "winners": "select * from winners order by all",
    "personas": "select * from personas order by agent_id",
}


def keynes_run(db: Path, env: dict[str, str], ray_address: str) -> subprocess.CompletedProcess:
    sets = [a for o in OVERRIDES + [f"workers.ray_address={ray_address}"] for a in ("--set", o)]
    return subprocess.run([str(Path(sys.executable).parent / "keynes"), "run", "experiments/quickstart.yaml", "--db", str(db), *sets],
                          env=env, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[2])


@pytest.fixture
def tmpfs(tmp_path):
    """A mount point for a tmpfs (mounted by the test at the size it needs), unmounted after."""
    point = tmp_path / "small"
    point.mkdir()
    yield point
    subprocess.run(["umount", str(point)], check=False)


def test_a_full_disk_ends_the_run_in_one_line_and_a_rerun_completes_exactly(tmp_path, tmpfs, session_cli):
    env, ray_address = session_cli
    reference = tmp_path / "reference.duckdb"
    done = keynes_run(reference, env, ray_address)
    assert done.returncode == 0, done.stderr[-3000:]
    needed = reference.stat().st_size

    # Room for the run's file twice over, then a filler that leaves one run's size, which
    # its write-ahead log and checkpoints outgrow before the last round is stored.
    size_mib = math.ceil(2 * needed / 2**20) + 1
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(tmpfs)], check=True)
    filler = tmpfs / "filler"
    filler.write_bytes(b"\0" * (size_mib * 2**20 - needed))
    db = tmpfs / "keynes.duckdb"

    full = keynes_run(db, env, ray_address)
    assert full.returncode != 0
    lines = [line for line in full.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"error: {db}: no space left on its file system (") and "MiB free" in lines[-1], full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "│" not in full.stderr, full.stderr[-3000:]

    # The file opens, and holds whole shards only: each stored shard with all its guesses.
    stored = q(db, "select count(*) from guesses")[0][0]
    assert 0 < stored < N * 4, f"{stored} guesses stored: the disk filled up outside play"
    assert q(db, """select count(*) from shards s left join (select run_id, round, shard, count(*) as c from guesses group by all) g
                    using (run_id, round, shard) where coalesce(g.c, 0) <> s.n""") == [(0,)]
    assert q(db, "select coalesce(sum(n), 0) from shards")[0][0] == stored

    filler.unlink()
    resumed = keynes_run(db, env, ray_address)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for table, sql in CONTENT.items():
        assert q(db, sql) == q(reference, sql), f"{table} differs from the uninterrupted run"
