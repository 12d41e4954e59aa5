"""No orphans: what a ``keynes`` command starts ends with it, even when it is killed.

Prefect's temporary API server (uvicorn) is a child that outlives a killed parent. So each
``keynes run``/``serve`` starts a small watchdog that Linux signals when its parent dies
(``PR_SET_PDEATHSIG``); it follows the parent's descendants while the parent lives and ends
those still running when it goes. It also keeps them in a record file, so that if the
watchdog itself is killed, the next ``keynes`` start ends what is left and says so. A command
that stops by itself (``keynes serve`` on Ctrl-C) calls ``release``: all of it is gone, the
record too, before the command exits.

A process can appear and lose its parent between two looks: Ray's raylet starts its agents,
and dies with the driver (Ray's own fate sharing), so agents started just before a SIGKILL
hang from no one the watchdog knows, waiting a minute for a GCS that is gone. So the command
also marks its environment (``KEYNES_RUN_TAG``), which every process it starts inherits, and
the watchdog ends every process that carries its mark.
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

#: Seconds between two looks at the parent's descendants.
POLL_S = 0.5
#: Seconds a leftover process gets to end on SIGTERM before it is killed.
GRACE_S = 3.0
#: The environment variable that marks every process a command starts (``pid:start time``).
TAG = "KEYNES_RUN_TAG"
_PR_SET_PDEATHSIG = 1
#: The signal the watchdog gets when its parent dies: one whose default action is to be ignored,
#: so that a parent killed while the watchdog is still starting (before its handler is set) does
#: not kill the watchdog with it; its first look then finds the parent gone and cleans up.
PARENT_DIED = signal.SIGURG
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cache_root() -> Path:
    """keynes's cache folder: ``$KEYNES_CACHE`` or ``~/.cache/keynes``."""
    root = os.environ.get("KEYNES_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "keynes"


def records_dir() -> Path:
    """Where each running command's record lives: ``$KEYNES_CACHE/runs`` or ``~/.cache/keynes/runs``."""
    return cache_root() / "runs"


def started(proc: psutil.Process) -> float:
    """When ``proc`` started, in seconds since boot on Linux: what tells a process from a later one
    with its pid. Not psutil's ``create_time``: that adds the boot time the kernel reports in whole
    wall-clock seconds, recomputed at every look, so a step or slew of the clock across a second
    moves every process's ``create_time`` by a second or more, and a live command would look dead
    to the next one (which would end its processes). Elsewhere: ``create_time``.

    Raises:
        psutil.Error: the process is gone.
    """
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after "pid (name)": field 3 on
        return round(int(fields[19]) / _CLOCK_TICKS, 2)  # field 22, starttime, in clock ticks since boot
    except (OSError, IndexError, ValueError):
        return proc.create_time()


def tag_of(proc: psutil.Process) -> str:
    """The mark a command gives every process it starts: ``pid:start time``."""
    return f"{proc.pid}:{started(proc)}"


def alive(pid: int, created: float) -> psutil.Process | None:
    """The process ``pid`` if it is still the one ``started`` at ``created`` (pids are reused)."""
    try:
        proc = psutil.Process(pid)
        # A record that holds a create_time (seconds since 1970, past 1e9) is read as one; others hold ``started``.
        now = proc.create_time() if created > 1e9 else started(proc)
        return proc if abs(now - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE else None
    except psutil.Error:
        return None


def end(processes: list[psutil.Process], grace_s: float = GRACE_S) -> list[psutil.Process]:
    """SIGTERM the processes, SIGKILL those still running after ``grace_s``; return them all."""
    for proc in processes:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return processes


def running(proc: psutil.Process) -> bool:
    """Whether a process still runs (a zombie does not: it only waits for its parent to reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill(processes: list[psutil.Process], wait_s: float = 1.0) -> None:
    """SIGKILL the processes; wait up to ``wait_s`` until none of them runs."""
    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass
    deadline = time.monotonic() + wait_s
    while any(running(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.05)


def clean_leftovers(directory: Path | None = None) -> list[str]:
    """End what earlier, killed commands left running; one line per record cleaned.

    A record whose owner still runs belongs to a live command and is left alone. The watchdog of
    a command killed a moment ago may still be ending its processes (up to ``GRACE_S`` each): it
    is given the time to finish, then what is left is ended here, the processes that carry the
    killed command's mark included, so that a new command starts once the old one is all gone.
    """
    directory = directory or records_dir()
    lines = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if alive(record["pid"], record["created"]):
            continue
        tag, me = f"{record['pid']}:{record['created']}", {os.getpid()}
        watchdogs = [p for p in tagged(tag, me) if _is_watchdog(p)]
        psutil.wait_procs(watchdogs, timeout=2 * GRACE_S + 2 * POLL_S)  # its end(): SIGTERM, then SIGKILL after GRACE_S
        left = [p for pid, created, _ in record["children"] if (p := alive(pid, created)) is not None]
        left += [p for p in tagged(tag, me) if p not in left]
        if left:
            names = ", ".join(sorted({p.name() for p in left}))
            end(left)
            lines.append(f"ended {len(left)} process(es) ({names}) left by an earlier `{record['command']}` "
                         f"(pid {record['pid']}) that was killed")
        path.unlink(missing_ok=True)
    return lines


def _is_watchdog(proc: psutil.Process) -> bool:
    try:
        return proc.cmdline()[1:3] == ["-m", "cli.runtime.processes"]
    except psutil.Error:
        return False


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for ``PARENT_DIED`` when the parent dies."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, PARENT_DIED, 0, 0, 0)


#: The watchdog started for this process, if any: one per process, however many commands it runs.
_WATCHDOG: list[subprocess.Popen] = []


def guard(command: str) -> list[str]:
    """Clean up after killed predecessors, then watch this process: returns the cleanup lines."""
    lines = clean_leftovers()
    if _WATCHDOG and _WATCHDOG[0].poll() is None:  # already watched (a second command in one process)
        return lines
    me = psutil.Process()
    os.environ[TAG] = tag_of(me)  # inherited by every process started from now on
    directory = records_dir()
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / f"{me.pid}.json"
    _write(record, command, me, [])
    _WATCHDOG[:] = [subprocess.Popen(
        [sys.executable, "-m", "cli.runtime.processes", str(me.pid), str(started(me)), str(record), command],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None, close_fds=True,
    )]
    return lines


def release(grace_s: float = 1.0) -> None:
    """For a command that stops by itself (``keynes serve`` on Ctrl-C): end what it started that
    still runs, then its watchdog, which removes the record; all before the command exits."""
    if not _WATCHDOG:
        return
    watchdog = _WATCHDOG.pop()
    me = psutil.Process()
    left = [p for p in me.children(recursive=True) if p.pid != watchdog.pid]
    if os.environ.get(TAG):
        left += [p for p in tagged(os.environ[TAG], {me.pid, watchdog.pid}) if p not in left]
    end(left, grace_s)
    watchdog.terminate()  # it looks once more for marked processes, then removes the record
    try:
        watchdog.wait(grace_s + POLL_S + 1.0)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()
        (records_dir() / f"{me.pid}.json").unlink(missing_ok=True)


def _write(path: Path, command: str, parent: psutil.Process, children: list[tuple[int, float, str]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": parent.pid, "created": started(parent), "command": command, "children": children}))
    tmp.replace(path)  # readers never see half a record


def descendants(children: list[psutil.Process], me: int) -> dict[int, tuple[int, float, str]]:
    """pid → (pid, start time, name) of each child still running (not the watchdog ``me``).

    A child that ends between the listing and this look is skipped: a short-lived
    subprocess of the parent must never be taken for the parent's end.
    """
    found = {}
    for child in children:
        if child.pid == me:
            continue
        try:
            found[child.pid] = (child.pid, started(child), child.name())
        except psutil.Error:
            continue
    return found


def tagged(tag: str, exclude: set[int], variable: str = TAG, prefix: bool = False) -> list[psutil.Process]:
    """The live processes whose environment carries ``variable=tag`` (with ``prefix``: a value
    that starts with ``tag``), but those in ``exclude``."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid in exclude:
            continue
        try:
            value = proc.environ().get(variable)
            if value and (value.startswith(tag) if prefix else value == tag) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:  # gone, or not ours to read
            continue
    return found


def watch(parent_pid: int, parent_created: float, record: Path, command: str) -> None:
    """The watchdog: follow the parent's descendants until the parent dies, then end them."""
    me = os.getpid()
    seen: dict[int, tuple[int, float, str]] = {}
    stop = {"now": False}
    signal.signal(PARENT_DIED, lambda *_: stop.update(now=True))  # the parent died (PDEATHSIG)
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))  # ended with its command's process group
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    parent = alive(parent_pid, parent_created)
    while parent is not None and not stop["now"]:
        try:
            found = descendants(parent.children(recursive=True), me)
        except psutil.NoSuchProcess:  # the parent is gone
            break
        if set(found) - set(seen):
            seen.update(found)
            _write(record, command, parent, list(seen.values()))
        time.sleep(POLL_S)
        try:
            if parent.status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.Error:  # gone
            break
    left = [p for pid, created, _ in seen.values() if (p := alive(pid, created)) is not None]
    # Started since the last look (a worker a raylet spawned a moment ago): still a descendant
    # of a process seen before, though the parent it hung from is gone.
    for proc in list(left):
        try:
            left += [c for c in proc.children(recursive=True) if c.pid != me and c not in left]
        except psutil.Error:
            continue
    # Started and orphaned between two looks: found by the mark they inherited.
    if os.environ.get(TAG):
        left += [p for p in tagged(os.environ[TAG], {me, parent_pid}) if p not in left]
    try:
        end(left)
    finally:
        record.unlink(missing_ok=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
