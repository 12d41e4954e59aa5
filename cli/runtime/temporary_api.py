"""Prefect's temporary API for ``keynes run``: started early, and started again if it ends mid-run.

Without ``PREFECT_API_URL`` Prefect starts a temporary API server (uvicorn, Prefect's own app)
as a child of the first flow, after importing ``prefect.server`` (1.7 s of one core here). A
run starts that same server itself instead, with Prefect's command (``server_command``), as
soon as Prefect's settings say that it needs one and before anything else is imported, so that
the server imports on one core while ``keynes run`` imports and starts Ray on the other. The run
then points Prefect's settings at it (``PREFECT_API_URL``, for the rest of the process) and never
imports ``prefect.server`` at all.

Once the server is gone, every API call retries a refused connection for about a minute before
it gives up: a server killed mid-run (the OOM killer, a stray ``kill -9``, or a Ctrl-C, which the
terminal sends to the server too, as it is in the run's process group) would stall the run and
then fail it. ``kept_alive`` watches the server while the flow runs and starts it again on the
same port and database: the calls in flight retry until it answers, and the run goes on, or ends
as interrupted within seconds.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from tasks.timings import mark

__all__ = ["UNREACHED", "TemporaryAPI", "TemporaryAPIError", "answering", "kept_alive", "server_command", "start_in_background"]

#: Seconds between two looks at the server.
POLL_S = 0.5
#: How uvicorn exits when its port was taken meanwhile.
PORT_TAKEN = 3
#: How Prefect says that its client found no API at a flow's start (its one-shot version check).
UNREACHED = "Failed to reach API"


class TemporaryAPIError(RuntimeError):
    """The temporary API did not answer: ``timed_out``, or it ended as it started."""

    def __init__(self, message: str, timed_out: bool):
        super().__init__(message)
        self.timed_out = timed_out


def _free_port() -> int:
    """A port of 8000–8999 free on 127.0.0.1, chosen as Prefect chooses its temporary API's."""
    for _ in range(50):
        port = random.randrange(8000, 9000)
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 8000–8999 for Prefect's temporary API")


def server_command(port: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment Prefect starts its temporary API with (uvicorn, no UI: what
    ``SubprocessASGIServer._run_uvicorn_command`` runs), built without importing the server."""
    import prefect
    from prefect.settings import get_current_settings

    args = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
            "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port), "--log-level", "error",
            "--lifespan", "on"]
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           **get_current_settings().to_environment_variables(exclude_unset=True)}
    return args, env


class TemporaryAPI:
    """Prefect's temporary API server as a process of this run: started, waited for, started
    again on the same port and database, and stopped at exit (as Prefect stops its own)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.args, self.env = server_command(self.port)
        self.process: subprocess.Popen | None = None
        self.lock = threading.Lock()  # one start at a time: the watcher's, or the caller's wait
        atexit.register(self.stop)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        """Start the server's process (it answers a few seconds later: ``wait``)."""
        self.process = subprocess.Popen(self.args, env=self.env)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait(self, timeout_s: float) -> None:
        """Block until the server answers; on another port if its own was taken meanwhile.

        Raises:
            TemporaryAPIError: it ended (its exit code), or did not answer within ``timeout_s``.
        """
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client() as client:
            while time.monotonic() < deadline:
                code = self.process.poll() if self.process else None
                if code == PORT_TAKEN and not self.answered:
                    self.port = _free_port()
                    self.args[self.args.index("--port") + 1] = str(self.port)
                    self.start()
                    continue
                if code is not None:
                    raise TemporaryAPIError(f"Prefect's temporary API ended with exit code {code} as it started (its output is above)", timed_out=False)
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise TemporaryAPIError(f"Prefect's temporary API did not start within {timeout_s:g} s", timed_out=True)

    #: Whether it has answered (``start_in_background``'s wait): until then a taken port moves it
    #: and the watcher leaves it alone; from then on Prefect calls it on its port.
    answered = False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


#: This process's temporary API (``start_in_background``), if it started one.
_API: TemporaryAPI | None = None


def start_in_background() -> Callable[[], None]:
    """Start Prefect's temporary API if this process's flows need it (no ``PREFECT_API_URL``,
    ephemeral mode allowed), and point Prefect's settings at it for the rest of the process.

    Returns:
        ``wait``: blocks until the server answers; raises ``TemporaryAPIError`` when it ends or
        does not answer within Prefect's startup timeout
        (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``). Call it before the flow.
    """
    global _API
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return lambda: None
    mark("api: starting")
    api = _API = TemporaryAPI()
    api.start()
    timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())

    def wait() -> None:
        with api.lock:
            api.wait(timeout_s)
            api.answered = True
        _point_prefect_at(api.url)
        mark("api: answering")

    return wait


def _point_prefect_at(url: str) -> None:
    """``PREFECT_API_URL`` for this process, its threads and its children, from now on; and no
    flow-run heartbeats, which only a lasting server reads (to find crashed runs: this one ends
    with the run) and whose thread a flow's end waits for, up to a second."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    global _POINTED
    os.environ["PREFECT_API_URL"] = url
    prefect.context.refresh_global_settings_context()  # what threads without a settings context read
    _POINTED = temporary_settings(updates={PREFECT_API_URL: url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    _POINTED.__enter__()  # kept for the rest of the process, as the environment is


#: The settings context ``_point_prefect_at`` entered (never left).
_POINTED = None


def _watch(api: TemporaryAPI, stop: threading.Event, say: Callable[[str], None]) -> None:
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    while not stop.wait(POLL_S):
        with api.lock:
            process = api.process
            if not api.answered or process is None or process.poll() is None:
                continue
            code = process.returncode
            if stop.wait(POLL_S):  # the flow is over: the run is ending
                continue
            say(f"Prefect's temporary API on port {api.port} ended ({'signal ' + str(-code) if code < 0 else f'exit {code}'}); "
                "starting it again")
            try:
                api.start()  # same port and database
                api.wait(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
            except Exception as exc:  # the run's own calls then fail and say why
                say(f"Prefect's temporary API could not be started again: {exc}")
                return


@contextmanager
def kept_alive(say: Callable[[str], None] = print) -> Iterator[None]:
    """While the block runs, start this process's temporary API again whenever it dies (``say``:
    one line each time). Without one (``PREFECT_API_URL`` is set), it does nothing."""
    if _API is None:
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(_API, stop, say), name="keynes-temporary-api", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()  # not joined: a restart in progress must not hold up a run that is ending


def answering(timeout_s: float) -> bool:
    """Wait until this process's temporary API answers again (``kept_alive`` starts it again when
    it dies); False at once when this process runs none, or if it does not answer in time."""
    api = _API
    if api is None:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if api.alive() and not api.lock.locked():
            return True
        time.sleep(0.1)
    return False
