"""Prefect's temporary API, started again if it ends while ``keynes run``'s flow runs.

Without ``PREFECT_API_URL`` Prefect starts its temporary API server (uvicorn) as a child of
the run and never looks at it again. Once it is gone, every API call retries a refused
connection for about a minute before it gives up. Killed (the OOM killer, a stray ``kill -9``),
the run crawled for many minutes, then crashed; on Ctrl-C, which the terminal sends to the
server too (it is in the run's process group), the interrupted flow's last call (recording
its end) took over a minute and ended in a traceback. ``kept_alive`` watches the server while
the flow runs and starts it again on the same port and database: the calls in flight retry
until it answers, and the run goes on, or ends as interrupted within seconds.

``start_in_background`` starts the server in a thread before the flow needs it: ``keynes run``
starts Ray and its actors meanwhile (the two took ~8 s each here, one after the other).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from tasks.timings import mark

#: Seconds between two looks at the server.
POLL_S = 0.5


def _watch(stop: threading.Event, say: Callable[[str], None]) -> None:
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the temporary API's instance (one per process; started by Prefect on first use)
    while not stop.wait(POLL_S):
        process = server.server_process
        if not server.running or process is None or process.poll() is None:
            continue
        code = process.returncode
        if stop.wait(POLL_S):  # the flow is over: the run is ending
            continue
        say(f"Prefect's temporary API on port {server.port} ended ({'signal ' + str(-code) if code < 0 else f'exit {code}'}); "
            "starting it again")
        server.running = False
        try:
            server.start()  # same port and database; blocks until it answers
        except Exception as exc:  # the run's own calls then fail and say why
            say(f"Prefect's temporary API could not be started again: {exc}")
            return


@contextmanager
def kept_alive(say: Callable[[str], None] = print) -> Iterator[None]:
    """While the block runs, start Prefect's temporary API again whenever it dies (``say``: one line each time)."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(stop, say), name="keynes-temporary-api", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()  # not joined: a restart in progress must not hold up a run that is ending


def start_in_background() -> Callable[[], None]:
    """Start Prefect's temporary API in a thread if this process's flow will need it (no
    ``PREFECT_API_URL``, ephemeral mode allowed); the flow then finds it answering.

    Returns:
        ``wait``: blocks until the server answers; raises what starting it raised (Prefect's
        ``RuntimeError`` when it does not answer within its startup timeout). Call it before
        the flow: Prefect takes a server that is starting for one that answers.
    """
    # Imported here, not in the thread: two threads importing the same packages at once can
    # see each other's modules half-initialised.
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return lambda: None
    failed: list[BaseException] = []

    def start() -> None:
        mark("api: starting")
        try:
            SubprocessASGIServer().start()  # the instance Prefect's client uses (keyed by no port)
            mark("api: answering")
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    starter = threading.Thread(target=start, name="keynes-temporary-api-start", daemon=True)
    starter.start()

    def wait() -> None:
        starter.join()
        if failed:
            raise failed[0]

    return wait


#: How Prefect says that its client found no API at a flow's start (its one-shot version check).
UNREACHED = "Failed to reach API"


def answering(timeout_s: float) -> bool:
    """Wait until this process's temporary API answers again (``kept_alive`` starts it again when
    it dies); False at once when this process runs none, or if it does not answer in time."""
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    if server.server_process is None:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process = server.server_process
        if server.running and process is not None and process.poll() is None:
            return True
        time.sleep(0.1)
    return False
