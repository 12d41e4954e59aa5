"""Prefect's temporary API, started again if it ends while ``keynes run``'s flow runs.

Without ``PREFECT_API_URL`` Prefect starts its temporary API server (uvicorn) as a child of
the run and never looks at it again. Once it is gone, every API call retries a refused
connection for about a minute before it gives up. Killed (the OOM killer, a stray ``kill -9``),
the run crawled for many minutes, then crashed; on Ctrl-C, which the terminal sends to the
server too (it is in the run's process group), the interrupted flow's last call (recording
its end) took over a minute and ended in a traceback. ``kept_alive`` watches the server while
the flow runs and starts it again on the same port and database: the calls in flight retry
until it answers, and the run goes on, or ends as interrupted within seconds.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

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

