"""Fault 8 (exposure): every server a ``keynes run`` starts listens on this machine only.

A real ``keynes run`` (simulated engine, its own local Ray with the dashboard, Prefect's temporary
API as without ``PREFECT_API_URL``) runs in a subprocess. While it plays, psutil lists the
listening TCP sockets of every process it started: its descendants and every process carrying its
``KEYNES_RUN_TAG`` mark (cli/runtime/processes.py) — the driver, Ray's gcs_server, raylet (object
manager included), dashboard, agents, autoscaler monitor and actor workers, and uvicorn. Each
must listen on 127.0.0.0/8 or ::1 (an IPv6 socket on ``::ffff:127.0.0.1`` included).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from cli.runtime.processes import TAG
from tests.conftest import REPO
from tests.support.processes import mark_of, marked

#: Two actors playing rounds of 40 simulated agents, 0.5 s per wave: the run is still playing when
#: the test has seen every server it expects, and ends it.
CONFIG = {
    "name": "bind",
    "seed": 3,
    "population": {"size": 40},
    "game": {"rounds": 20},
    "arms": {"engines": [{"kind": "simulated", "latency_s": 0.5, "concurrency": 5}], "prompts": ["basic"]},
    "workers": {"actors": 2, "shard_size": 20, "dashboard": True},
    "report": {"enabled": False},
}

#: Servers the test must have seen listening (a part of a label), so that it cannot pass on none.
EXPECTED = ("gcs_server", "raylet", "ray::AgentWorker", "dashboard.py", "-m uvicorn", "-m cli.app")


def on_this_machine(ip: str) -> bool:
    """Whether a listening address is loopback (127.0.0.0/8, ::1, or 127.x mapped into IPv6)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def label(proc: psutil.Process) -> str:
    """The process's name, and the module or script a Python process runs (uvicorn, Ray's dashboard)."""
    args = proc.cmdline()
    for i, arg in enumerate(args[1:], 1):
        if arg == "-m" and i + 1 < len(args):
            return f"{proc.name()} -m {args[i + 1]}"
        if arg.endswith(".py"):
            return f"{proc.name()} {Path(arg).name}"
    return proc.name()


def started_by(run: psutil.Process, mark: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The run, its descendants, and the processes carrying its ``mark`` (reparented Ray agents);
    and those carrying the mark (its watchdog among them: none would mean a mark that is not the run's)."""
    procs = {run.pid: run}
    try:
        procs |= {p.pid: p for p in run.children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    carriers = marked(mark, {run.pid})  # one look at every process's environment per call
    return list((procs | {p.pid: p for p in carriers}).values()), carriers


def listening(procs: list[psutil.Process]) -> set[tuple[str, int, str]]:
    """(process, pid, address:port) of each listening TCP socket of ``procs``."""
    found = set()
    for proc in procs:
        try:
            found |= {(label(proc), proc.pid, f"{c.laddr.ip}:{c.laddr.port}")
                      for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:  # ended between the listing and the look
            continue
    return found


def missing(seen: set[tuple[str, int, str]]) -> list[str]:
    """The servers of ``EXPECTED`` not seen listening yet."""
    return [part for part in EXPECTED if not any(part in name for name, _, _ in seen)]


@pytest.mark.slow
def test_every_server_a_keynes_run_starts_listens_on_localhost_only(tmp_path, prefect_home):
    config = tmp_path / "bind.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "db": str(tmp_path / "bind.duckdb")}))
    # A user's shell: none of the suite's Ray or Prefect settings; keynes must set what it needs.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_API") and k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", TAG)}
    env.update(PREFECT_HOME=str(prefect_home), KEYNES_CACHE=str(tmp_path / "cache"),
               RAY_TMPDIR=tempfile.mkdtemp(prefix="kray-"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    log = tmp_path / "run.log"
    with log.open("w") as out:
        run = subprocess.Popen([sys.executable, "-m", "cli.app", "run", str(config)], cwd=REPO, env=env,
                               stdout=out, stderr=subprocess.STDOUT)
    parent = psutil.Process(run.pid)
    mark = mark_of(run.pid)  # its KEYNES_RUN_TAG, as cli.runtime.processes.guard sets it
    seen: set[tuple[str, int, str]] = set()
    procs: list[psutil.Process] = []
    carriers: set[int] = set()  # processes seen carrying the mark: none would mean a mark that is not the run's
    try:
        deadline, enough = time.monotonic() + 300, None
        while run.poll() is None and time.monotonic() < (enough or deadline):
            procs, carrying = started_by(parent, mark)
            carriers |= {p.pid for p in carrying}
            seen |= listening(procs)
            if enough is None and not missing(seen):
                enough = time.monotonic() + 1.0  # a little longer, for any server that starts last
            time.sleep(0.3)
    finally:
        run.kill()  # mid-run: end it and everything it started (its watchdog would, test_orphans.py)
        run.wait(10)
        rest = [*procs, *marked(mark, {run.pid})]
        for proc in rest:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(rest, timeout=30)
    assert carriers, f"no process carried the run's mark {mark}: reparented processes would go unchecked"
    assert not missing(seen), f"never saw listening: {missing(seen)}; saw {sorted(seen)}\n{log.read_text()[-3000:]}"
    exposed = {(pid, where): name for name, pid, where in sorted(seen) if not on_this_machine(where.rsplit(":", 1)[0])}
    assert not exposed, "listening beyond this machine: " + "; ".join(f"{name} (pid {pid}) on {where}" for (pid, where), name in exposed.items())
