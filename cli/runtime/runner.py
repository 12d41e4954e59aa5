"""The warm stack's runner: ``keynes run`` without importing Prefect, the flow and Ray each time.

A command imports Prefect, the experiment flow and Ray before it does anything (docs/benchmarks.md,
"Warm start": a handed-over command calls the flow 0.30 s after it starts). ``keynes up`` starts
this runner beside Ray's head and Prefect's server: it imports them once (``PRELOAD``) and listens
on a Unix socket in the stack's folder. A ``keynes run`` that finds it (``hand_off``, called first
thing by the CLI) sends its arguments, working directory, environment and its standard input, output
and error (the file descriptors themselves, so the progress bars draw on the caller's terminal); the
runner forks, and the child runs the command as the caller would have, with all of that. The caller
waits for the child's exit code and forwards the signals it gets (Ctrl-C, SIGTERM, SIGHUP) to it; if
the caller dies, the child is told by its socket closing and stops as it would on SIGTERM.

The runner refuses a command (which then runs in its own process, as without a runner) when the
caller's interpreter or keynes checkout is not the runner's, when a keynes module the runner
imported has changed on disk since (an edited checkout: the runner then ends, and ``keynes up``
starts a new one), or when the caller's Prefect settings differ from those the runner imported
Prefect with (beyond the API's address, which every command sets itself).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path

__all__ = ["hand_off", "serve"]

#: What the runner imports once, for every command it runs.
PRELOAD = ("prefect", "prefect.flows", "flows.experiment", "tasks.pool", "design.loading", "warehouse.store", "ray")
#: The commands the runner runs (the others gain little: they start no flow).
COMMANDS = ("run",)
#: Signals the caller forwards to the command.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds a caller waits for the runner to take its command before running it itself.
CONNECT_TIMEOUT_S = 2.0
#: Seconds a caller waits for the runner to fork its command before running it itself.
FORK_TIMEOUT_S = 20.0
#: The source tree of this keynes (a caller of another checkout is refused).
SOURCE = Path(__file__).resolve().parents[2]
#: True in a command the runner forked: it runs the command itself, never hands it on.
_FORKED = False


def _prefect_settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PREFECT_") and k != "PREFECT_API_URL"}


# ---------------------------------------------------------------- the caller's side


def hand_off(argv: list[str]) -> int | None:
    """Run the command ``argv`` (``sys.argv[1:]``) in the warm stack's runner, if one runs and takes
    it; its exit code, or None when the caller should run it itself."""
    from cli.runtime import settings, stack

    if _FORKED or not argv or argv[0] not in COMMANDS or os.environ.get(stack.OFF) == "off":
        return None
    settings.apply()  # as every command does first: the runner's environment has them too
    record = stack.read()
    if record is None or not record.runner:
        return None
    path = Path(record.runner)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        client.settimeout(CONNECT_TIMEOUT_S)
        client.connect(str(path))
        request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "python": sys.executable,
                              "source": str(SOURCE)}).encode()
        socket.send_fds(client, [b"%d\n" % len(request)], [0, 1, 2])
        client.sendall(request)
        client.settimeout(FORK_TIMEOUT_S)
        replies = client.makefile("rb")
        first = json.loads(replies.readline() or b"{}")
        if "pid" not in first:  # refused (a line says why, in the runner's log) or the runner ended
            client.close()
            return None
        client.sendall(b"g")  # the child waits for this: a caller that gave up never has its command run twice
    except (OSError, ValueError):
        client.close()  # a child forked meanwhile sees the socket close and ends without running anything
        return None
    client.settimeout(None)
    child = int(first["pid"])

    def forward(signum: int, _frame) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:  # a forwarded signal's handler returns, so the read goes on (PEP 475)
        line = replies.readline()
        done = json.loads(line) if line else {}
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        client.close()
    if "exit" not in done:
        print(f"keynes: the warm stack's runner ended while it ran this command (pid {child}); see its log in "
              f"{path.parent / 'runner.log'}", file=sys.stderr)
        return 1
    return int(done["exit"])


# ---------------------------------------------------------------- the runner's side


def _sources() -> dict[str, int]:
    """The keynes modules imported so far, with their files' modification times."""
    found = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(SOURCE) and ".venv" not in Path(file).parts:
            try:
                found[file] = os.stat(file).st_mtime_ns
            except OSError:
                continue
    return found


def _peer(conn: socket.socket) -> int:
    """The pid of the process at the other end of ``conn``."""
    import struct

    pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid


def _stale(sources: dict[str, int]) -> str | None:
    """Which keynes module the runner imported has changed on disk since (None: none has)."""
    for file, mtime in sources.items():
        try:
            if os.stat(file).st_mtime_ns != mtime:
                return f"{file} changed since the runner started"
        except OSError:
            return f"{file} is gone"
    return None


def _refusal(request: dict, settings: dict[str, str], peer: int) -> str | None:
    """Why the runner must not run ``request`` for this caller (None: it may)."""
    import psutil

    try:
        if os.getpid() in {p.pid for p in psutil.Process(peer).parents()}:
            return "it comes from a command this runner runs"
    except psutil.Error:
        return "its caller is gone"
    if request.get("python") != sys.executable or request.get("source") != str(SOURCE):
        return f"another interpreter or checkout ({request.get('python')}, {request.get('source')})"
    theirs = _prefect_settings(request.get("env", {}))
    if theirs != settings:
        return f"other Prefect settings than the runner's ({', '.join(sorted(k for k in theirs.keys() | settings.keys() if theirs.get(k) != settings.get(k)))})"
    return None


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, 64, 3)
    if len(fds) != 3 or b"\n" not in head:
        for fd in fds:
            os.close(fd)
        raise ValueError("not a keynes command")
    size, _, body = head.partition(b"\n")
    body = bytearray(body)
    while len(body) < int(size):
        chunk = conn.recv(int(size) - len(body))
        if not chunk:
            raise ValueError("the caller hung up")
        body += chunk
    return json.loads(bytes(body)), fds


def _reap(_signum=None, _frame=None) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _child(listener: socket.socket, conn: socket.socket, request: dict, fds: list[int]) -> None:
    """In the forked child: become the caller's command; never returns."""
    global _FORKED
    code = 1
    try:
        listener.close()
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=stream.isatty())
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["keynes", *request["argv"]]
        _FORKED = True
        conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
        if conn.recv(1) != b"g":  # the caller gave up waiting and runs the command itself
            os._exit(0)
        _watch_caller(conn)
        from cli.app import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 130
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        except (OSError, ValueError):
            pass
        os._exit(code)


def _watch_caller(conn: socket.socket) -> None:
    """End this command as SIGTERM would when its caller is gone (its end of the socket closes)."""
    import threading

    def watch() -> None:
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="keynes-caller", daemon=True).start()


def serve(path: Path) -> None:
    """Import ``PRELOAD``, then run every command a caller hands over, each in a forked child, until
    ended (or until a keynes module changes on disk)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sources = _sources()
    settings = _prefect_settings(dict(os.environ))
    signal.signal(signal.SIGCHLD, _reap)
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    print(f"runner: ready on {path} ({len(sources)} keynes modules imported)", flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:
            continue
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError) as exc:
            print(f"runner: a connection that sent no command ({exc})", flush=True)
            conn.close()
            continue
        stale = _stale(sources)
        refusal = stale or _refusal(request, settings, _peer(conn))
        if refusal is not None:
            print(f"runner: refused `keynes {' '.join(request.get('argv', []))}`: {refusal}", flush=True)
            for fd in fds:
                os.close(fd)
            conn.sendall(b'{"refused": true}\n')
            conn.close()
            if stale:  # an edited checkout: a runner of older code ends
                path.unlink(missing_ok=True)
                return
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(listener, conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.close()
        print(f"runner: `keynes {' '.join(request['argv'])}` runs as pid {pid}", flush=True)
        _reap()


if __name__ == "__main__":
    # Through the module's own name, so that the commands it forks see their own ``_FORKED``
    # (``python -m`` runs this file as ``__main__``, a second copy of the module).
    from cli.runtime.runner import serve as serve_here

    serve_here(Path(sys.argv[1]))
