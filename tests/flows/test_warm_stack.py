"""The warm stack (cli/runtime/stack.py): `keynes up` starts a Ray head and a Prefect API that
`keynes run` joins instead of starting its own, keeping its actors for the next run (tasks/kept.py);
a killed run leaves it running, `keynes down` ends every process of it; a stale record or a stack
of another keynes is reported in one line.

Real processes throughout: `keynes up`, `run` and `down` as subprocesses with a cache of their own
(``KEYNES_CACHE``, where the record lives), the real Ray and Prefect server they start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from cli.runtime import stack as warm
from cli.runtime.processes import TAG, started
from tests.conftest import REPO
from tests.reliability.test_bind_localhost import listening, on_this_machine
from tests.support.waiting import wait_for

#: A tiny simulated experiment; ``SLOW`` plays long enough to be killed mid-round.
TINY = {
    "name": "warm",
    "seed": 5,
    "population": {"size": 20},
    "game": {"rounds": 1},
    "arms": {"engines": [{"kind": "simulated", "latency_s": 0.0}], "prompts": ["basic"]},
    "workers": {"actors": 2, "shard_size": 10},
    "report": {"enabled": False},
}
SLOW = {**TINY, "name": "warm-killed", "game": {"rounds": 20},
        "arms": {"engines": [{"kind": "simulated", "latency_s": 1.0, "concurrency": 5}], "prompts": ["basic"]}}

#: What the test's subprocesses ask Ray's GCS: its nodes, and the pid of each job's driver.
CLUSTER = """
import json, sys, ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR")
kept = {}
for a in ray.util.list_named_actors(all_namespaces=True):
    if a["name"].startswith("keynes-kept-"):
        try:
            kept[a["name"]] = ray.get(ray.get_actor(a["name"], namespace=a["namespace"]).where.remote())["pid"]
        except (ValueError, ray.exceptions.RayActorError):  # being ended as we look (another engine's pool)
            continue
print(json.dumps({"nodes": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]), "drivers": [j["DriverPid"] for j in state.jobs()],
                  "kept": kept}))
"""


def keynes(env: dict[str, str], *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.launch", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def cluster(env: dict[str, str], address: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CLUSTER, address], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def user_env(tmp_path, prefect_home) -> dict[str, str]:
    """A user's shell: a cache of its own, a migrated Prefect home, none of the suite's Ray or Prefect API."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_API") and k not in ("RAY_ADDRESS", TAG, warm.STACK_TAG, warm.OFF)}
    env.update(KEYNES_CACHE=str(tmp_path / "cache"), PREFECT_HOME=str(prefect_home),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    return env


@pytest.mark.slow
def test_run_joins_the_warm_stack_survives_a_killed_run_and_down_leaves_nothing(tmp_path, user_env):
    record = tmp_path / "cache" / "stack.json"
    tag_prefix = f"{record}#"
    try:
        upped = keynes(user_env, "up")
        assert upped.returncode == 0, upped.stderr[-3000:]
        stack = warm.read(record)
        assert stack is not None and not stack.gone(), upped.stderr
        assert f"Ray: {stack.ray_address}" in upped.stderr and "keynes down" in upped.stderr, upped.stderr
        # Everything the stack runs listens on this machine only.
        seen = listening(warm.marked(stack.tag))
        for part in ("gcs_server", "raylet", "prefect"):
            assert any(part in name for name, _, _ in seen), (part, seen)
        assert all(on_this_machine(where.rsplit(":", 1)[0]) for _, _, where in seen), seen
        before = cluster(user_env, stack.ray_address)

        config = tmp_path / "tiny.yaml"
        config.write_text(yaml.safe_dump({**TINY, "db": str(tmp_path / "tiny.duckdb")}))
        run = subprocess.Popen([sys.executable, "-m", "cli.launch", "run", str(config)], cwd=REPO, env=user_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _out, err = run.communicate(timeout=400)
        assert run.returncode == 0, err[-3000:]
        joined = [line for line in err.splitlines() if line.startswith("joining the warm stack")]
        assert joined == [f"joining the warm stack: Ray at {stack.ray_address}, Prefect API at {stack.prefect_url} (keynes down stops them)"], err
        assert "20 guesses written" in err, err
        after = cluster(user_env, stack.ray_address)
        # The run was handed to the stack's runner, which ran it in a process of its own (its Prefect,
        # flow and Ray imported already): that process's driver was a job of the warm Ray, whose one
        # node is the same as before.
        ran = handed(stack)
        assert len(ran) == 1 and ran[0] != run.pid, (ran, run.pid)
        assert ran[0] in after["drivers"] and after["nodes"] == before["nodes"] and len(after["nodes"]) == 1, (before, after)
        assert not stack.gone()
        # Its two actors were kept, and the same run again finds them (the same processes) instead of starting its own.
        assert before["kept"] == {} and sorted(name[-4:] for name in after["kept"]) == ["-2-0", "-2-1"], after
        config.write_text(yaml.safe_dump({**TINY, "db": str(tmp_path / "again.duckdb")}))
        again = keynes(user_env, "run", str(config))
        assert again.returncode == 0 and "20 guesses written" in again.stderr, again.stderr[-3000:]
        assert cluster(user_env, stack.ray_address)["kept"] == after["kept"]

        # A run killed mid-round: its watchdog ends what the run started, never the stack it joined.
        slow = tmp_path / "slow.yaml"
        slow.write_text(yaml.safe_dump({**SLOW, "db": str(tmp_path / "slow.duckdb")}))
        killed = subprocess.Popen([sys.executable, "-m", "cli.launch", "run", str(slow)], cwd=REPO, env=user_env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: killed.poll() is not None or cluster(user_env, stack.ray_address)["kept"].keys() - after["kept"].keys(),
                 300, "the run to be killed to start its actor in the stack")
        assert killed.poll() is None
        time.sleep(3)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        wait_for(lambda: not list((tmp_path / "cache" / "runs").glob("*.json")), 60, "the killed run's watchdog to finish")
        assert not stack.gone(), "the stack ended with a run that joined it"
        now = cluster(user_env, stack.ray_address)
        # Its own engine's pool (another latency: another spec) replaced the first one's, whose actors it ended.
        assert now["nodes"] == before["nodes"] and len(now["kept"]) == 2 and not now["kept"].keys() & after["kept"].keys(), now

        # Ctrl-C on a handed-over run reaches the process that runs it: the run ends interrupted,
        # as it does in a process of its own.
        slow.write_text(yaml.safe_dump({**SLOW, "name": "warm-interrupted", "db": str(tmp_path / "interrupted.duckdb")}))
        interrupted = subprocess.Popen([sys.executable, "-m", "cli.launch", "run", str(slow)], cwd=REPO, env=user_env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: interrupted.poll() is not None or rows(tmp_path / "interrupted.duckdb", "select count(*) from guesses where round > 1"),
                 300, "the run to be interrupted to play its second round")
        assert interrupted.poll() is None and len(handed(stack)) == 4
        interrupted.send_signal(signal.SIGINT)
        _out, err = interrupted.communicate(timeout=120)
        assert interrupted.returncode != 0, err[-2000:]
        assert rows(tmp_path / "interrupted.duckdb", "select distinct status from runs") == [("interrupted",)], err[-2000:]

        # An edited checkout: the runner holds older code, so it refuses the run (which runs in its
        # own process, as without a runner) and ends.
        source = REPO / "design" / "seen.py"
        mtime = source.stat().st_mtime_ns
        os.utime(source, ns=(mtime, mtime + 1_000_000_000))
        try:
            config.write_text(yaml.safe_dump({**TINY, "db": str(tmp_path / "edited.duckdb")}))
            edited = subprocess.Popen([sys.executable, "-m", "cli.launch", "run", str(config)], cwd=REPO, env=user_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _out, err = edited.communicate(timeout=400)
        finally:
            os.utime(source, ns=(mtime, mtime))
        assert edited.returncode == 0 and "20 guesses written" in err, err[-3000:]
        assert len(handed(stack)) == 4 and edited.pid in cluster(user_env, stack.ray_address)["drivers"]
        log = (Path(stack.logs) / "runner.log").read_text()
        assert "design/seen.py changed since the runner started" in log, log
        assert not Path(stack.runner).exists()

        downed = keynes(user_env, "down", timeout=120)
        assert downed.returncode == 0, downed.stderr
        assert downed.stderr.splitlines()[-1] == "warm stack down", downed.stderr
        assert not warm.marked(tag_prefix), [p.cmdline() for p in warm.marked(tag_prefix)]
        assert stack.gone() == list(warm.ESSENTIAL)
        assert not record.exists() and not Path(stack.ray_temp_dir).exists()
        again = keynes(user_env, "down", timeout=120)
        assert again.returncode == 0 and again.stderr.strip() == f"no warm stack is up (no record in {record})", again.stderr
    finally:
        left = warm.marked(tag_prefix)
        for proc in left:
            proc.kill()
        psutil.wait_procs(left, timeout=30)


def handed(stack: warm.Stack) -> list[int]:
    """The pids of the commands the stack's runner ran, in order (its log says each)."""
    log = (Path(stack.logs) / "runner.log").read_text()
    return [int(line.rsplit(" ", 1)[1]) for line in log.splitlines() if " runs as pid " in line]


def rows(db: Path, sql: str) -> list[tuple]:
    """``sql`` on the warehouse a run writes (read-only, while it may be writing): its rows, or [] for
    none, a count of 0, or a file not made or held by the writer this instant."""
    import duckdb

    if not db.exists():
        return []
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            found = con.execute(sql).fetchall()
            return [] if found == [(0,)] else found
    except duckdb.Error:  # held by the run's writer this instant, or its tables not made yet
        return []


def _record(path: Path, processes: dict[str, list[float]], **fields) -> warm.Stack:
    stack = warm.Stack(tag=f"{path}#test", ray_address="127.0.0.1:1", prefect_url="http://127.0.0.1:1/api",
                       ray_temp_dir=str(path.parent / "ray"), auth_mode="disabled", num_cpus=2, logs=str(path.parent / "logs"),
                       processes=processes, **{**warm.identity(), **fields})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stack.__dict__))
    return stack


@pytest.mark.quick
def test_a_stale_record_is_reported_in_one_line_and_down_ends_what_is_left(tmp_path, monkeypatch):
    """Ray's head and Prefect's server are gone (processes that ended) but a helper of the stack,
    marked with its tag, still runs (as Ray's agents do when the raylet is killed)."""
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(warm.OFF, raising=False)
    record = warm.record_path()
    ended = subprocess.Popen(["true"])
    ended.wait()
    stack = _record(record, {name: [ended.pid, 1.0] for name in warm.ESSENTIAL})
    helper = subprocess.Popen(["sleep", "120"], env={**os.environ, warm.STACK_TAG: stack.tag})
    try:
        joined, line = warm.for_command(None)
        assert joined is None and line == (f"the warm stack in {record} is stale (gcs_server, raylet, prefect ended); starting this "
                                           "run's own Ray (keynes down clears it, keynes up starts it again)")
        assert warm.for_command("10.0.0.1:6379") == (None, None)  # a configured cluster wins, silently
        from tests.support.cli import invoke

        result, lines = invoke("down")
        assert result.exit_code == 0, lines
        assert lines == ["the warm stack's gcs_server, raylet, prefect had ended already", "ended 1 process(es) of the warm stack (sleep)",
                         "warm stack down"], lines
        helper.wait(10)
        assert not record.exists()
        assert warm.for_command(None) == (None, None)  # no record: today's behaviour, nothing said
    finally:
        if helper.poll() is None:
            helper.kill()


@pytest.mark.quick
def test_a_stack_of_another_keynes_is_not_joined(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(warm.OFF, raising=False)
    live = [subprocess.Popen(["sleep", "120"]) for _ in warm.ESSENTIAL]
    try:
        processes = {name: [p.pid, started(psutil.Process(p.pid))] for name, p in zip(warm.ESSENTIAL, live)}
        record = warm.record_path()
        _record(record, processes, keynes="0.0.1", python="/elsewhere/bin/python")
        joined, line = warm.for_command(None)
        assert joined is None and line == (f"the warm stack in {record} runs another keynes (keynes 0.0.1, python /elsewhere/bin/python); "
                                           "not joining it, starting this run's own Ray (keynes down, then keynes up, replaces it)")
        _record(record, processes)  # this keynes's own: joined
        joined, line = warm.for_command(None)
        assert joined is not None and line.startswith("joining the warm stack: Ray at 127.0.0.1:1, ")
        monkeypatch.setenv(warm.OFF, "off")
        assert warm.for_command(None) == (None, None)
    finally:
        for proc in live:
            proc.kill()
            proc.wait(10)
