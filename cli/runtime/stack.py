"""The warm local stack: a Ray head and a Prefect API server kept running between commands.

Starting a local Ray costs every ``keynes run`` 10–20 s on a small machine; joining one that runs
costs 2–4 s. ``keynes up`` starts both detached, on 127.0.0.1 only, and writes a record
(``$KEYNES_CACHE/stack.json``, default ``~/.cache/keynes/stack.json``); ``keynes run`` and
``keynes personas --backstories`` read it and join the stack when it is up (``for_command``),
and ``keynes down`` ends every process the stack started (``down``). A runner of the stack holds
Prefect, the flow and Ray imported and runs each ``keynes run`` in a forked child
(cli/runtime/runner.py), so a run that joins the stack skips those imports too.

Every process of the stack carries a mark in its environment (``KEYNES_STACK_TAG``: the record's
path and a random id), inherited by everything Ray and Prefect start in turn (Ray's agents and
actor workers included): ``keynes down`` finds them all by it, even if the record is gone or a
part died and left its children behind. A stack never carries a command's ``KEYNES_RUN_TAG``
(cli/runtime/processes.py), so no command's watchdog ends it. Ray's files go to a folder of the
stack's own (``ray start --temp-dir``), never /tmp/ray: ``ray.init(address="auto")`` elsewhere on
the machine does not find this Ray, and keynes joins it only by the address in its record.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import psutil

from cli.runtime.processes import TAG as RUN_TAG
from cli.runtime.processes import alive, cache_root, end, started, tagged

__all__ = ["STACK_TAG", "Stack", "StackError", "down", "for_command", "read", "record_path", "up"]

#: The environment variable that marks every process of the stack.
STACK_TAG = "KEYNES_STACK_TAG"
#: The Ray namespace of the commands that join the stack (their kept actors are found in it).
NAMESPACE = "keynes"
#: ``KEYNES_WARM_STACK=off``: commands run as without a stack (their own Ray and Prefect API).
OFF = "KEYNES_WARM_STACK"
#: Seconds ``up`` waits for Ray's head and Prefect's server to answer.
START_TIMEOUT_S = 180.0
#: Starts of Ray's head ``up`` tries (on a busy machine its raylet can miss Ray's fixed 30 s).
RAY_ATTEMPTS = 3
#: The parts whose processes must all run for the stack to be up (the others are their helpers).
ESSENTIAL = ("gcs_server", "raylet", "prefect")


class StackError(RuntimeError):
    """The stack could not be started (one line: what failed, and where its output is)."""


def record_path() -> Path:
    """Where the stack's record lives: ``$KEYNES_CACHE/stack.json`` or ``~/.cache/keynes/stack.json``."""
    return cache_root() / "stack.json"


def identity() -> dict[str, str]:
    """What a stack must share with a command that joins it: its actors run this keynes, on this
    interpreter, with this Ray."""
    from importlib.metadata import version

    # Ray's version from its metadata: importing Ray here (~1 s) would come before the run's header.
    return {"keynes": version("keynes"), "python": sys.executable, "ray": version("ray")}


@dataclass
class Stack:
    """A warm stack as its record describes it."""

    tag: str
    ray_address: str
    prefect_url: str
    ray_temp_dir: str
    auth_mode: str
    num_cpus: int
    keynes: str
    python: str
    ray: str
    logs: str
    created: float = field(default_factory=time.time)
    #: name → [pid, start time] of each essential process (``ESSENTIAL``).
    processes: dict[str, list[float]] = field(default_factory=dict)
    #: The runner's socket (cli/runtime/runner.py): ``keynes run`` runs there, its imports done.
    runner: str = ""

    @property
    def ui_url(self) -> str:
        return self.prefect_url.removesuffix("/api")

    def gone(self) -> list[str]:
        """The essential parts no longer running (empty: the stack is up)."""
        return [name for name in ESSENTIAL if alive(*self.processes.get(name, (0, 0.0))) is None]

    def foreign(self) -> str | None:
        """Why this keynes must not join the stack (it runs another keynes, interpreter or Ray), or None."""
        mine = identity()
        differs = [f"{key} {getattr(self, key)}" for key in ("keynes", "python", "ray") if getattr(self, key) != mine[key]]
        return ", ".join(differs) or None


def read(path: Path | None = None) -> Stack | None:
    """The recorded stack, or None (no record, or one this keynes cannot read)."""
    path = path or record_path()
    try:
        return Stack(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(stack: Stack, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(stack), indent=1))
    tmp.replace(path)  # readers never see half a record


def marked(prefix: str) -> list[psutil.Process]:
    """The processes whose ``KEYNES_STACK_TAG`` starts with ``prefix`` (a tag, or a record's path)."""
    return tagged(prefix, {os.getpid()}, variable=STACK_TAG, prefix=True)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(tag: str) -> dict[str, str]:
    """The stack's environment: this command's, marked with the stack's tag and without any
    command's mark (a watchdog would end the stack with that command)."""
    env = {k: v for k, v in os.environ.items() if k not in (RUN_TAG, "PREFECT_API_URL", "RAY_ADDRESS")}
    env.setdefault("RAY_AUTH_MODE", "disabled")  # as ensure_ray's local Ray: loopback keeps other machines out
    env[STACK_TAG] = tag
    return env


def _by_name(procs: list[psutil.Process], prefect: subprocess.Popen) -> dict[str, list[float]]:
    """The essential processes among ``procs``, by name."""
    found: dict[str, list[float]] = {"prefect": [prefect.pid, started(psutil.Process(prefect.pid))]}
    for proc in procs:
        try:
            name = proc.name()
            if name in ("gcs_server", "raylet"):
                found[name] = [proc.pid, started(proc)]
        except psutil.Error:
            continue
    return found


def up(num_cpus: int | None = None, say=print) -> Stack:
    """Start a Ray head and a Prefect API server, detached, on 127.0.0.1; record them.

    Raises:
        StackError: either did not start (what did start is ended, the record removed).
    """
    import httpx

    path = record_path()
    tag = f"{path}#{uuid.uuid4().hex[:12]}"
    env = _environment(tag)
    logs = Path(tempfile.mkdtemp(prefix="keynes-stack-"))  # short: Ray's socket paths must fit 107 characters
    api_port = _free_port()
    cpus = num_cpus or os.cpu_count() or 2
    api_log = open(logs / "prefect.log", "w")
    prefect = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(api_port)],
        env=env, stdin=subprocess.DEVNULL, stdout=api_log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    runner_socket = logs / "runner.sock"  # short: a socket's path must fit 107 characters
    with open(logs / "runner.log", "w") as runner_log:  # it imports meanwhile, and listens once it has
        runner = subprocess.Popen([sys.executable, "-m", "cli.runtime.runner", str(runner_socket)], env=env, stdin=subprocess.DEVNULL,
                         stdout=runner_log, stderr=subprocess.STDOUT, start_new_session=True)
    stack = Stack(tag=tag, ray_address="", prefect_url=f"http://127.0.0.1:{api_port}/api", ray_temp_dir="",
                  auth_mode=env["RAY_AUTH_MODE"], num_cpus=cpus, logs=str(logs), runner=str(runner_socket), **identity())
    _write(stack, path)  # from now on `keynes down` finds it, even if this command is killed
    try:
        deadline = time.monotonic() + START_TIMEOUT_S * RAY_ATTEMPTS
        for attempt in range(1, RAY_ATTEMPTS + 1):
            ray_port, ray_dir, ray_output = _free_port(), logs / f"ray-{attempt}", logs / f"ray-start-{attempt}.log"
            stack.ray_address, stack.ray_temp_dir = f"127.0.0.1:{ray_port}", str(ray_dir)
            _write(stack, path)
            with open(ray_output, "w") as output:
                ray_start = subprocess.Popen(
                    [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address", "127.0.0.1",
                     "--port", str(ray_port), "--num-cpus", str(cpus), "--object-store-memory", str(1 << 30),
                     "--include-dashboard", "false", "--dashboard-host", "127.0.0.1", "--temp-dir", str(ray_dir), "--disable-usage-stats",
                     # Ports Ray would take by default (10001, 52365): another Ray on the machine may hold them.
                     "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port())],
                    env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
                )
            try:
                code = ray_start.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise StackError(f"Ray's head did not start within {START_TIMEOUT_S:g} s (its output: {ray_output})") from None
            if code == 0:
                break
            # Ray gives its raylet a fixed 30 s to register: a busy machine misses it. What it
            # started is ended, and it starts again, on other ports.
            if attempt < RAY_ATTEMPTS and "timed out during startup" in _last_line(ray_output):
                say(f"Ray's head did not start in time ({_last_line(ray_output)[:60]}...): a busy machine; trying again")
                end([p for p in marked(tag) if not _within(p, prefect.pid) and not _within(p, runner.pid)])
                continue
            raise StackError(f"Ray's head did not start: `ray start` exited {code}: {_last_line(ray_output)} (its output: {ray_output})")
        with httpx.Client() as client:
            while True:
                if prefect.poll() is not None:
                    raise StackError(f"Prefect's server ended with exit code {prefect.returncode} as it started (its output: {logs / 'prefect.log'})")
                try:
                    if client.get(f"{stack.prefect_url}/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise StackError(f"Prefect's server did not answer within {START_TIMEOUT_S:g} s (its output: {logs / 'prefect.log'})")
                time.sleep(0.2)
        stack.processes = _by_name(marked(tag), prefect)
        if stack.gone():
            raise StackError(f"the stack's {', '.join(stack.gone())} ended as it started (its output: {logs})")
        _write(stack, path)
        return stack
    except BaseException:
        down(path, quiet=True, keep_logs=True)  # what started is ended; the output stays for the message
        raise
    finally:
        api_log.close()


def _within(proc: psutil.Process, root: int) -> bool:
    """Whether ``proc`` is the process ``root`` or one of its descendants."""
    try:
        return proc.pid == root or any(parent.pid == root for parent in proc.parents())
    except psutil.Error:
        return False


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def down(path: Path | None = None, quiet: bool = False, keep_logs: bool = False) -> list[str]:
    """End every process of the stack recorded at ``path`` (found by its mark, and by the record
    if the mark cannot be read), remove its Ray folder and its record; one line each of what was done."""
    path = path or record_path()
    stack = read(path)
    procs = marked(stack.tag if stack else f"{path}#")
    if stack is not None:
        procs += [p for pid, created in stack.processes.values() if (p := alive(int(pid), created)) is not None and p not in procs]
    lines = []
    if stack is not None and not quiet and (gone := stack.gone()):
        lines.append(f"the warm stack's {', '.join(gone)} had ended already")
    if procs:
        names = sorted({_name(p) for p in procs} - {""})
        end(procs)
        lines.append(f"ended {len(procs)} process(es) of the warm stack ({', '.join(names)})")
    if stack is not None:
        if not keep_logs:
            shutil.rmtree(stack.logs, ignore_errors=True)
    path.unlink(missing_ok=True)
    return lines


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def for_command(ray_address: str | None) -> tuple[Stack | None, str | None]:
    """The warm stack a command should join, and the one line to say about it.

    None when the config names a Ray cluster (``workers.ray_address``: that wins), with
    ``KEYNES_WARM_STACK=off``, when no stack
    is recorded (silently: today's behaviour), when the record is stale (its processes are gone)
    or the stack runs another keynes (a line says so; the command starts its own Ray as without one).
    """
    if ray_address or os.environ.get(OFF) == "off":
        return None, None
    path = record_path()
    stack = read(path)
    if stack is None:
        return None, (f"{path}: not a warm stack record this keynes can read; starting this run's own Ray "
                      "(keynes down removes it)") if path.exists() else None
    gone = stack.gone()
    if not stack.processes and time.time() - stack.created < START_TIMEOUT_S:
        return None, f"the warm stack in {path} is still starting (keynes up); starting this run's own Ray"
    if gone:
        return None, (f"the warm stack in {path} is stale ({', '.join(gone)} ended); starting this run's own Ray "
                      "(keynes down clears it, keynes up starts it again)")
    foreign = stack.foreign()
    if foreign:
        return None, (f"the warm stack in {path} runs another keynes ({foreign}); not joining it, starting this run's "
                      "own Ray (keynes down, then keynes up, replaces it)")
    return stack, f"joining the warm stack: Ray at {stack.ray_address}, Prefect API at {stack.prefect_url} (keynes down stops them)"


def job_environment(stack: Stack) -> dict[str, str]:
    """The variables of this command that the stack's processes lack or hold otherwise: handed to
    this command's Ray workers (a job's ``runtime_env``), so its actors see what they would see
    in a Ray of its own (``KEYNES_CACHE``, ``KEYNES_TIMINGS``, an engine's API key, ...). Ray's
    own settings (``RAY_*``) are the stack's, given when it started."""
    try:
        theirs = psutil.Process(int(stack.processes["raylet"][0])).environ()
    except (psutil.Error, KeyError):
        theirs = {}
    # Not this command's mark either: kept actors outlive it, and its watchdog ends what carries it.
    return {k: v for k, v in os.environ.items()
            if theirs.get(k) != v and not k.startswith("RAY_") and k not in (STACK_TAG, RUN_TAG)}


def join(stack: Stack, say=print) -> None:
    """Connect to the stack's Ray, with this command's environment for its workers (its Prefect
    API is the command's already: ``cli.common.warm_stack``); the pools it starts are
    kept in the stack for the next command (tasks/kept.py; ``say`` prints a line while it waits
    for another command that uses them)."""
    os.environ["RAY_AUTH_MODE"] = stack.auth_mode
    from tasks import kept
    from tasks.pool import ensure_ray

    environment = job_environment(stack)
    ensure_ray(stack.ray_address, joining={"namespace": NAMESPACE, "runtime_env": {"env_vars": environment}})
    kept.enable(record_path().with_suffix(".lock"), say, environment)


def join_in_background(stack: Stack, say=print) -> Callable[[], None]:
    """``join`` in a thread, while the command imports Prefect and its flow (seconds each, on
    different cores). Returns ``wait``: blocks until joined, raising what the join raised."""
    failed: list[BaseException] = []

    def work() -> None:
        try:
            with _quiet_thread_warning():
                join(stack, say)
        except BaseException as exc:  # handed to the caller by wait()
            failed.append(exc)

    thread = threading.Thread(target=work, name="keynes-join", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if failed:
            raise failed[0]

    return wait


class _NotMainThread(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "is not the main thread" not in record.getMessage()


@contextmanager
def _quiet_thread_warning() -> Iterator[None]:
    """Without Ray's warning that ``ray.init`` in a thread sets no SIGTERM handler: the command's
    own handlers stay, as ``ensure_ray`` keeps them in the main thread."""
    ray_log = logging.getLogger("ray._private.worker")
    quiet = _NotMainThread()
    ray_log.addFilter(quiet)
    try:
        yield
    finally:
        ray_log.removeFilter(quiet)
