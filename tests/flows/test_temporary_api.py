"""Prefect's temporary API gone mid-run: `keynes run` starts it again (cli/runtime/temporary_api.py).

Against a server that has ended, Prefect's client retries every API call's refused connection for
about a minute (5 retries, 2 to 32 s apart) before it gives up: without a new server, a run killed
with SIGKILL of a few seconds' play would crawl for many minutes, then crash; on Ctrl-C (which
reaches the server too: it is in the run's process group) the run would take over a minute to
record its end, then exit 1 with a traceback instead of 130.
"""

from __future__ import annotations

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
from tests.support.waiting import wait_for

AGENTS, SHARD = 200, 20
CONFIG = {
    "name": "api-gone",
    "seed": 4,
    "population": {"spec": "education.yaml", "size": AGENTS},
    "game": {"rounds": 3},
    # 10 shards a round on 2 actors, 0.3 s each: a few seconds of play after the kill.
    "arms": {"engines": [{"kind": "simulated", "latency_s": 0.3}], "prompts": ["basic"]},
    "workers": {"actors": 2, "shard_size": SHARD},
    "report": {"enabled": False},
}
#: The command line of Prefect's temporary API server.
SERVER = "prefect.server.api.server:create_app"


def _found(run: psutil.Process, marker: str) -> psutil.Process | None:
    try:
        return next((p for p in run.children(recursive=True) if marker in " ".join(p.cmdline())), None)
    except psutil.Error:
        return None


def run_and_strike(tmp_path: Path, prefect_home: Path, strike) -> tuple[subprocess.Popen, str, str, float]:
    """``keynes run`` with its own temporary API; once its actors play, ``strike(run, server)``.

    Returns the finished process, its output, the server's port and the seconds it ran on after
    the strike (the run is given 150 s; a minute of refused connections per call would take minutes).
    """
    config, db = tmp_path / "api.yaml", tmp_path / "api.duckdb"
    config.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(prefect_home), KEYNES_CACHE=str(tmp_path / "cache"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    # A terminal's foreground job, whose Ctrl-C is not ignored: a process started by a pytest-xdist
    # worker (or from a script's background job) inherits SIGINT ignored, and Python keeps it so.
    run = subprocess.Popen([sys.executable, "-m", "cli.app", "run", str(config), "--db", str(db)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    parent = psutil.Process(run.pid)
    try:
        # keynes run starts its actors beside its temporary API, before the flow: wait for the flow's experiment row too
        wait_for(lambda: (_found(parent, "ray::AgentWorker") is not None and _begun(db)) or run.poll() is not None, 240,
                 "the actors to start and the flow to record its experiment")
        server = _found(parent, SERVER)
        assert run.poll() is None and server is not None, "the run ended before its temporary API could be struck"
        port = re.search(r"--port (\d+)", " ".join(server.cmdline())).group(1)
        strike(run, server)
        struck_at = time.monotonic()
        out, _ = run.communicate(timeout=150)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    return run, out, port, time.monotonic() - struck_at


def stored(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def _begun(db: Path) -> bool:
    try:
        return db.exists() and stored(db, "select count(*) from experiments") == [(1,)]
    except duckdb.Error:  # the run holds the file this moment
        return False


@pytest.mark.slow
def test_ctrl_c_ends_a_run_with_its_own_temporary_api_within_seconds(tmp_path, prefect_home):
    # A terminal's Ctrl-C: SIGINT to the run's process group, the temporary API server included.
    run, out, port, after_s = run_and_strike(tmp_path, prefect_home, lambda run, _: os.killpg(run.pid, signal.SIGINT))
    assert run.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert after_s < 60, f"{after_s:.0f} s to end after Ctrl-C"  # not a minute of refused connections
    assert stored(tmp_path / "api.duckdb", "select status from experiments") == [("interrupted",)]
    print(f"ended {after_s:.1f} s after Ctrl-C")


@pytest.mark.slow
def test_a_temporary_api_killed_as_it_first_answers_and_again_mid_run_is_started_again_and_the_run_completes(tmp_path, prefect_home):
    """Two kills of the run's temporary API: (1) as soon as it first answers, while Ray and the
    actors still start: the flow may begin while keynes starts the API again, and Prefect's
    one-shot version check at a flow's start ("Failed to reach API") would end the run with exit 1
    (the Gemma chaos run's one failure); the flow waits for the API that is starting again;
    (2) once an actor has played its first shard: keynes starts it again on the same port and
    database, and the run completes (not a minute of refused connections per call)."""
    config, db = tmp_path / "api.yaml", tmp_path / "api.duckdb"
    config.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(prefect_home), KEYNES_TIMINGS="1", KEYNES_CACHE=str(tmp_path / "cache"))
    run = subprocess.Popen([sys.executable, "-m", "cli.app", "run", str(config), "--db", str(db)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    moments = [" api: answering", "actor: first shard played"]
    ports = []
    try:
        for line in run.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if moments and line.rstrip().endswith(moments[0]):
                server = _found(psutil.Process(run.pid), SERVER)
                assert server is not None, "".join(lines)
                ports.append(re.search(r"--port (\d+)", " ".join(server.cmdline())).group(1))
                server.send_signal(signal.SIGKILL)
                moments.pop(0)
        run.wait(150)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    out = "".join(lines)
    assert not moments and len(set(ports)) == 1, out[-3000:]
    assert run.returncode == 0, out[-3000:]
    assert out.count(f"Prefect's temporary API on port {ports[0]} ended (signal 9); starting it again") == 2, out[-3000:]
    assert stored(db, "select count(*), count(distinct (round, agent_id)) from guesses") == [(AGENTS * 3,) * 2]
    assert stored(db, "select count(*) from rounds") == [(3,)]
    assert stored(db, "select status from experiments") == [("completed",)]


@pytest.mark.quick
def test_the_temporary_api_is_started_with_prefects_own_command(monkeypatch):
    """``keynes run`` starts the server itself and never imports ``prefect.server``: with the
    command and environment Prefect's ``SubprocessASGIServer`` would use (a new Prefect that
    starts it otherwise fails here)."""
    import prefect.server.api.server as prefect_server

    from cli.runtime.temporary_api import server_command

    started = []
    monkeypatch.setattr(prefect_server.subprocess, "Popen", lambda args, env: started.append((args, env)))
    prefect_server.SubprocessASGIServer(8123)._run_uvicorn_command()
    prefect_server.SubprocessASGIServer._instances.pop(8123)
    assert server_command(8123) == started[0]
