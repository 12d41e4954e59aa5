"""Faults 3 and 7: ``keynes run`` killed with SIGKILL mid-run, then run again; readers while
a run writes.

An uninterrupted reference run is sampled by ``keynes sql`` readers as it writes (fault 7);
a second run into another file is SIGKILLed in the middle of a round and started again with
the same command (fault 3). The resumed experiment must equal the reference row by row.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil
import pytest
import yaml

from tests.conftest import REPO
from tests.support.prefect_db import seed_home
from tests.support.sql import held_when

N, ROUNDS, ARMS, SHARD = 120, 4, 2, 20
CONFIG = {
    "name": "resume",
    "seed": 9,
    "population": {"spec": "education.yaml", "size": N},
    "game": {"ratio": "2/3", "rounds": ROUNDS},
    # ~0.25 s per shard and phase: the run lasts ~10 s, long enough to be killed mid-round.
    "arms": {"engines": [{"kind": "simulated", "rule": "uniform", "latency_s": 0.25}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 2, "shard_size": SHARD},
    "report": {"enabled": False},  # the page built mid-run by `keynes report` is the one tested
}
TOTAL = N * ROUNDS * ARMS

# Consistency of one snapshot: shard rows and guesses are committed together, and a round's
# outcome only after all its guesses.
SNAPSHOT_SQL = """
select (select count(*) from guesses) as guesses,
       (select coalesce(sum(n), 0)::bigint from shards) as shard_agents,
       (select count(*) from rounds) as rounds,
       (select count(*) from rounds r left join (select run_id, round, count(*) as c from guesses group by all) g
               using (run_id, round) where coalesce(g.c, 0) != r.n) as incomplete_rounds,
       (select count(*) - count(distinct (run_id, round, agent_id)) from guesses) as duplicates
"""


def cli_env(api_url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env.update(RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", PREFECT_LOGGING_LEVEL="WARNING")
    if api_url:
        env["PREFECT_API_URL"] = api_url  # the session's Prefect API: no server start per run
    return env


def keynes(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.app", *args]


def read(path: Path, sql: str, timeout: float = 30) -> list[tuple]:
    """A read-only query that waits while the writer holds the file."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with duckdb.connect(str(path), read_only=True) as con:
                return con.execute(sql).fetchall()
        except duckdb.IOException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, prefect_api, local_ray):
    """The config, and an environment that points ``keynes run`` at the session's Prefect
    API and Ray cluster (joined with ``workers.ray_address``), so no run pays their start."""
    from prefect.settings import PREFECT_API_URL

    root = tmp_path_factory.mktemp("resume")
    config = root / "resume.yaml"
    data = dict(CONFIG, workers=dict(CONFIG["workers"], ray_address=local_ray.get_runtime_context().gcs_address))
    config.write_text(yaml.safe_dump(data))
    return root, config, cli_env(PREFECT_API_URL.value())


def committed_guesses(path: Path) -> int:
    """Guesses committed so far, read in this process (no start-up cost); 0 before the schema exists."""
    try:
        return read(path, "select count(*) from guesses")[0][0]
    except duckdb.CatalogException:
        return 0


def snapshot(db: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(keynes("sql", SNAPSHOT_SQL, "--db", str(db), "--format", "json"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted run, read by ``keynes sql`` over and over while it writes, and by
    ``keynes report`` started as soon as its first shard is committed.

    Each snapshot is taken by a new ``keynes sql`` process. The first three are taken mid-run
    whatever the machine's speed: each once more guesses are committed than the last one saw,
    while this process holds the file, so that the writer's next commit waits until the snapshot
    is taken (``held``: what was committed, and what the snapshot saw). How many more there are
    depends on the machine's speed. The simulated engine sleeps 0.25 s per shard and phase
    (>= 5.5 s for the 47 shards after the first commit), so the report is started while the run
    still writes."""
    root, config, env = setup
    db = root / "reference.duckdb"
    start = time.monotonic()
    # Its commits wait while a snapshot below holds the file: a lock timeout far longer than one.
    writer = subprocess.Popen(keynes("run", str(config), "--db", str(db)), cwd=REPO, env={**env, "KEYNES_LOCK_TIMEOUT_S": "600"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    snapshots, failures, report, builder, held = [], [], None, None, []

    def take_snapshot() -> None:
        reader = snapshot(db, env)
        if reader.returncode != 0:
            failures.append(reader.stderr)
        else:
            snapshots.append(json.loads(reader.stdout)[0])

    def more_than(after: int):
        def ready(n: int) -> bool:
            assert n < TOTAL and writer.poll() is None, f"the run ended before snapshot {len(held) + 1} ({n} guesses)"
            return n > after
        return ready

    out = root / "mid-run-report.html"
    try:
        while writer.poll() is None and not (db.exists() and committed_guesses(db)):
            time.sleep(0.1)
        if writer.poll() is None:
            # A report page built from the half-written file (another reader of the same file).
            report = {"guesses_at_start": committed_guesses(db), "out": out}
            builder = subprocess.Popen(keynes("report", "--db", str(db), "--out", str(out)),
                                       cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(3):
            with held_when(db, "select count(*) from guesses", more_than(held[-1][0] if held else 0), 600,
                           "more guesses committed") as committed:
                take_snapshot()
                held.append((committed, snapshots[-1]["guesses"] if snapshots else None))
        while writer.poll() is None:
            take_snapshot()
            time.sleep(0.5)
        _, err = writer.communicate(timeout=600)
        if builder is not None:
            _, built_err = builder.communicate(timeout=300)
            report.update(code=builder.returncode, stderr=built_err[-3000:])
    finally:
        for process in (writer, builder):
            if process is not None and process.poll() is None:
                process.kill()
    assert writer.returncode == 0, err[-3000:]
    final = snapshot(db, env)
    assert final.returncode == 0, final.stderr[-3000:]
    return {"db": db, "snapshots": snapshots, "final": json.loads(final.stdout)[0], "failures": failures,
            "seconds": time.monotonic() - start, "report": report, "held": held}


@pytest.mark.slow
def test_readers_see_consistent_snapshots_while_a_run_writes(reference):
    snapshots, final = reference["snapshots"], reference["final"]
    assert reference["failures"] == []
    # Three snapshots mid-run (0 < guesses < total), each exactly what was committed when it was
    # taken; a run that commits nothing before its end fails the fixture's wait for the first.
    held = reference["held"]
    assert len(held) == 3 and [seen for _, seen in held] == [committed for committed, _ in held], held
    assert all(0 < committed < TOTAL for committed, _ in held), held
    assert final == {"guesses": TOTAL, "shard_agents": TOTAL, "rounds": ROUNDS * ARMS, "incomplete_rounds": 0, "duplicates": 0}
    for s in snapshots:
        # Whole shards only, their guesses with them; rounds only once all their guesses are in.
        assert s["guesses"] == s["shard_agents"] and s["guesses"] % SHARD == 0, s
        assert s["incomplete_rounds"] == 0 and s["duplicates"] == 0, s
    # Snapshots only grow, never past the finished run.
    counts = [s["guesses"] for s in snapshots] + [final["guesses"]]
    assert counts == sorted(counts), counts
    assert [s["rounds"] for s in snapshots] == sorted(s["rounds"] for s in snapshots)
    print(f"{len(snapshots)} snapshots over {reference['seconds']:.1f} s: {counts}")


@pytest.mark.slow
def test_a_report_built_while_a_run_writes_succeeds(reference):
    report = reference["report"]
    assert report is not None, "the run ended before its first shard was seen committed"
    assert report["code"] == 0, report["stderr"]
    assert report["out"].exists() and report["out"].stat().st_size > 100_000
    # Started on a half-written warehouse: some guesses were stored, not all of them.
    assert 0 < report["guesses_at_start"] < TOTAL, report["guesses_at_start"]


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="module")
def default_path(setup, tmp_path_factory):
    """``keynes run`` as a user starts it: no Prefect API and no Ray address, so each run starts
    its own temporary Prefect API and its own local Ray."""
    root, _, env = setup
    config = root / "resume-default.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    # A migrated Prefect database, as in a user's PREFECT_HOME after their first run.
    home = seed_home(tmp_path_factory.mktemp("prefect-home"), tmp_path_factory)
    # Nor the test session's Ray settings: the CLI must choose them itself, as for a user.
    default_env = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "RAY_ENABLE_UV_RUN_RUNTIME_ENV")}
    default_env["PREFECT_HOME"] = str(home)
    return config, default_env, home


@pytest.mark.slow
@pytest.mark.parametrize("path", ["session", "default"])
def test_sigkill_mid_round_then_rerun_finishes_exactly_like_an_uninterrupted_run(path, setup, default_path, reference):
    root, config, env = setup
    home = None
    if path == "default":
        config, env, home = default_path
    db = root / f"killed-{path}.duckdb"
    command = keynes("run", str(config), "--db", str(db))
    victim = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait for round 1 of arm 0 to be committed and a later round to be part-played.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and victim.poll() is None:
            if db.exists():
                ((rounds, partial),) = read(db, """select (select count(*) from rounds),
                    (select count(*) from (select run_id, round from guesses except select run_id, round from rounds))""")
                if rounds >= 1 and partial:
                    break
            time.sleep(0.05)
        if victim.poll() is not None:
            pytest.fail(f"the run ended (exit {victim.returncode}) before it could be killed:\n{victim.stderr.read()[-3000:]}")
        children = descendants(victim.pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    # With the session's Ray and Prefect API a killed run leaves no process behind. A default
    # run's own processes (Prefect's temporary API server, Ray's agents) may outlive a SIGKILL
    # by a while: they are reaped here, so that this test is about resuming exactly once.
    time.sleep(1)
    lingering = [p for p in children if alive(p)]
    leftovers = [" ".join(p.cmdline()[:3]) for p in lingering]
    for p in lingering:
        p.kill()
    if path == "session":
        assert not leftovers, leftovers

    ((guesses_before, rounds_before, shards_before),) = read(
        db, "select (select count(*) from guesses), (select count(*) from rounds), (select count(*) from shards)")
    assert 0 < rounds_before < ROUNDS * ARMS and 0 < guesses_before < TOTAL
    finished_before = read(db, "select run_id, round from rounds order by all")
    shard_times_before = read(db, "select run_id, round, shard, committed_at from shards order by all")

    resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    played, written = map(lambda s: int(s.replace(",", "")),
                          re.search(r"done: (\d+) round\(s\) played, ([\d,]+) guesses written", resumed.stderr).groups())
    # Finished rounds were not played again; only missing guesses were written.
    assert played == ROUNDS * ARMS - rounds_before
    assert written == TOTAL - guesses_before
    kept = set(read(db, "select run_id, round, shard, committed_at from shards"))
    assert set(shard_times_before) <= kept  # committed shards untouched
    assert set(finished_before) <= set(read(db, "select run_id, round from rounds"))

    # Exactly N × rounds × arms guesses, no duplicates, every round and run finished.
    assert read(db, "select count(*), count(distinct (run_id, round, agent_id)) from guesses") == [(TOTAL, TOTAL)]
    assert read(db, "select count(*), sum(n) from rounds") == [(ROUNDS * ARMS, TOTAL)]
    assert read(db, "select count(*), sum(n) from shards") == [(ROUNDS * ARMS * (N // SHARD), TOTAL)]
    assert read(db, "select distinct status from runs union all select distinct status from experiments") == [("completed",), ("completed",)]

    # Row by row equal to the uninterrupted run with the same seed.
    ref = reference["db"]
    for sql in (
        "select run_id, round, agent_id, guess, valid, raw from guesses order by run_id, round, agent_id",
        "select run_id, round, n, n_valid, mean, median, std, target, winning_guess, n_winners from rounds order by all",
        "select run_id, round, agent_id from winners order by all",
        "select * exclude (experiment_id) from personas order by agent_id",
    ):
        assert read(db, sql) == read(ref, sql), sql
    print(f"{path}: killed after {rounds_before} rounds / {guesses_before} guesses; resume played {played} rounds, "
          f"wrote {written}; processes reaped after the kill: {leftovers}")
