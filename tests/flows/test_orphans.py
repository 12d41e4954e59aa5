"""No orphans: `keynes run` killed with SIGKILL mid-run leaves none of its processes behind,
and a record left by a killed command is cleaned up (and reported) at the next start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
import yaml

from cli.runtime.processes import TAG, clean_leftovers, descendants, started, tag_of, tagged
from tests.conftest import REPO
from tests.support.waiting import wait_for

#: Simulated agents that take 1 s per wave: the run is still playing when it is killed.
SLOW = {
    "name": "killed",
    "seed": 2,
    "population": {"size": 40},
    "game": {"rounds": 20},
    "arms": {"engines": [{"kind": "simulated", "latency_s": 1.0, "concurrency": 5}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 20},
    "report": {"enabled": False},
}



def _still_running(procs: list[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.slow
def test_sigkill_of_keynes_run_leaves_no_process_it_started(tmp_path, prefect_home):
    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump({**SLOW, "db": str(tmp_path / "killed.duckdb")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(prefect_home), KEYNES_CACHE=str(tmp_path / "cache"),
               RAY_TMPDIR=tempfile.mkdtemp(prefix="kray-"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    run = subprocess.Popen([sys.executable, "-m", "cli.app", "run", str(config)], cwd=REPO, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    parent = psutil.Process(run.pid)
    try:
        # Mid-run: Prefect's temporary API (uvicorn) is up and rounds are being played.
        wait_for(lambda: (tmp_path / "killed.duckdb").exists() and any(
            "uvicorn" in " ".join(c.cmdline()) for c in parent.children(recursive=True)), 240, "the run to be playing")
        time.sleep(2)
        started = [c for c in parent.children(recursive=True)]
        assert any("uvicorn" in " ".join(c.cmdline()) for c in started)
        os.kill(run.pid, signal.SIGKILL)  # the parent only: its children are not told
        run.wait(10)
        try:
            wait_for(lambda: not _still_running(started), 60, "every process the run started to end")
        except AssertionError:
            raise AssertionError(f"still running: {[' '.join(p.cmdline())[:120] for p in _still_running(started)]}") from None
    finally:
        for proc in _still_running([parent, *parent.children(recursive=True)] if parent.is_running() else []):
            proc.kill()
    assert not list((tmp_path / "cache" / "runs").glob("*.json"))  # the watchdog removed its record


def test_the_next_start_ends_what_a_killed_command_left_and_says_so(tmp_path):
    orphan = subprocess.Popen(["sleep", "120"])
    try:
        child = psutil.Process(orphan.pid)
        dead = subprocess.Popen(["true"])
        dead.wait()
        record = {"pid": dead.pid, "created": 1.0, "command": "keynes run",
                  "children": [[child.pid, child.create_time(), child.name()]]}
        (tmp_path / f"{dead.pid}.json").write_text(json.dumps(record))
        me = psutil.Process()  # a record of a live command is not touched (this one without `started`)
        (tmp_path / "live.json").write_text(json.dumps({"pid": me.pid, "created": me.create_time(), "command": "keynes serve",
                                                        "children": [[child.pid, child.create_time(), child.name()]]}))
        lines = clean_leftovers(tmp_path)
        assert lines == [f"ended 1 process(es) (sleep) left by an earlier `keynes run` (pid {dead.pid}) that was killed"]
        orphan.wait(10)  # ended (a TimeoutExpired here would mean it still runs)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json"]
    finally:
        if orphan.poll() is None:
            orphan.kill()


def test_a_clock_step_does_not_make_a_live_command_look_dead(tmp_path, monkeypatch):
    """psutil's create_time adds the boot time the kernel reports in whole wall-clock seconds,
    recomputed at every look: when the clock steps (NTP) or slews across a second, every process's
    create_time moves with it, and the next command took a live one (a `keynes serve` of days) for
    killed and ended its processes. Records hold each start in clock ticks since boot."""
    child = subprocess.Popen(["sleep", "120"])
    try:
        me, proc = psutil.Process(), psutil.Process(child.pid)
        (tmp_path / "live.json").write_text(json.dumps({"pid": me.pid, "created": started(me), "command": "keynes serve",
                                                        "children": [[proc.pid, started(proc), proc.name()]]}))
        real = psutil.Process.create_time
        assert started(me) == pytest.approx(real(me) - psutil.boot_time(), abs=0.02)
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 1.0)  # the boot time moved a second
        assert clean_leftovers(tmp_path) == [] and child.poll() is None
        assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json"]
        assert tag_of(me) == f"{me.pid}:{started(me)}"
    finally:
        child.kill()
        child.wait(10)


def test_a_child_that_ends_while_the_watchdog_looks_is_skipped_not_taken_for_the_parents_end():
    # The watchdog lists the parent's children, then reads each one. A short-lived child can end
    # in between; that must not end the watch, or the watchdog would end every process it had
    # seen (a Prefect server, a Ray raylet, ...) while their command still runs.
    staying, leaving = subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sleep", "60"])
    try:
        listed = [psutil.Process(staying.pid), psutil.Process(leaving.pid)]
        leaving.kill()
        leaving.wait(10)  # gone between the listing and the look
        with pytest.raises(psutil.NoSuchProcess):
            listed[1].name()
        found = descendants(listed, me=os.getpid())
        assert list(found) == [staying.pid] and found[staying.pid][2] == "sleep"
        assert descendants(listed[:1], me=staying.pid) == {}  # the watchdog never lists itself
    finally:
        staying.kill()
        staying.wait(10)


#: A command that starts the watchdog, then a process that orphans itself at once (its parent
#: exits, so it hangs from no process the watchdog follows, as a Ray agent does when the raylet
#: dies with the driver), prints that process's pid and waits to be killed.
ORPHANING_COMMAND = """
import os, subprocess, sys, time
from cli.runtime.processes import guard
guard("keynes run")
middle = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen(['sleep', '120']); print(p.pid, flush=True)"],
    stdout=subprocess.PIPE, text=True)
print(middle.stdout.readline().strip(), flush=True)
middle.wait()
time.sleep(120)
"""


def test_a_process_orphaned_between_two_looks_is_ended_by_the_mark_it_inherited(tmp_path):
    env = dict(os.environ, KEYNES_CACHE=str(tmp_path / "cache"))
    env.pop("KEYNES_RUN_TAG", None)
    command = subprocess.Popen([sys.executable, "-c", ORPHANING_COMMAND], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    orphan = None
    try:
        orphan = psutil.Process(int(command.stdout.readline()))
        wait_for(lambda: orphan.ppid() != command.pid and orphan.ppid() not in {c.pid for c in psutil.Process(command.pid).children(recursive=True)},
                 30, "the sleep to be orphaned")
        assert orphan.environ()["KEYNES_RUN_TAG"].startswith(f"{command.pid}:")
        os.kill(command.pid, signal.SIGKILL)
        command.wait(10)
        wait_for(lambda: not _still_running([orphan]), 30, "the orphan to be ended")
    finally:
        if orphan is not None and _still_running([orphan]):
            orphan.kill()


def test_the_next_start_waits_for_a_killed_commands_watchdog_and_ends_what_carries_its_mark(tmp_path):
    """The chaos benchmark's orphan: a command's watchdog may still be ending its processes (one
    that ignores SIGTERM gets ``GRACE_S``) when the next command, started at once, prints its first
    line. The next start waits for that watchdog, then ends what carries the killed command's
    mark: when ``clean_leftovers`` returns, nothing of the killed command runs."""
    env = dict(os.environ, KEYNES_CACHE=str(tmp_path / "cache"))
    env.pop(TAG, None)
    stubborn = ORPHANING_COMMAND.replace("['sleep', '120']", """['sh', '-c', 'trap "" TERM; exec sleep 120']""")
    assert stubborn != ORPHANING_COMMAND
    command = subprocess.Popen([sys.executable, "-c", stubborn], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    orphan = None
    try:
        orphan = psutil.Process(int(command.stdout.readline()))
        wait_for(lambda: orphan.ppid() != command.pid and orphan.name() == "sleep", 30, "the sleep to be orphaned")
        tag = orphan.environ()[TAG]
        watchdogs = [p for p in tagged(tag, set()) if "cli.runtime.processes" in p.cmdline()]
        assert len(watchdogs) == 1
        os.kill(command.pid, signal.SIGKILL)
        command.wait(10)
        clean_leftovers(tmp_path / "cache" / "runs")  # returns only once the watchdog's GRACE_S for the sleep is over
        assert tagged(tag, set()) == [], "a process of the killed command still runs"
    finally:
        if orphan is not None and _still_running([orphan]):
            orphan.kill()
