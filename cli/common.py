"""What every ``keynes`` command shares: its consoles, one-line failures, progress bars, the
settings given to Prefect and Ray before either is imported, and the report server's checks.

Every command exits 2 with one clear line on bad input.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.text import Text

from cli.runtime import settings

STARTUP_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: Whether the user chose Prefect's log level (read before ``settings.apply`` sets keynes's default).
_CHOSEN: dict[str, bool] = {}


def start() -> None:
    """Before a command imports Prefect or Ray: give them keynes's settings (each only where the
    environment leaves it unset), which every process keynes starts inherits."""
    _CHOSEN.setdefault("log_level", "PREFECT_LOGGING_LEVEL" in os.environ)
    settings.apply()


def log_level_chosen() -> bool:
    """Whether the user set PREFECT_LOGGING_LEVEL themselves (then keynes never changes it)."""
    return _CHOSEN.get("log_level", "PREFECT_LOGGING_LEVEL" in os.environ)



# Every string printed is plain text: names, paths and values from configs, warehouses and models
# (an experiment "pilot [v2]", a cell "[/]", ":x:") are shown as they are, never read as markup
# or emoji; what is bold says so with `bold()`.
console = Console(stderr=True, markup=False, emoji=False)
out = Console(markup=False, emoji=False)


def bold(text: str, rest: str = "") -> Text:
    """``text`` in bold, then ``rest``, both as plain text."""
    return Text.assemble((text, "bold"), rest)


def main_options(
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show the libraries' own output: llama.cpp's loading lines, Prefect's INFO logs.")] = False,
) -> None:
    """keynes: very large p-beauty-contest simulations with LLM agents."""
    start()
    if verbose:
        # Read where the libraries start (Prefect at import, llama.cpp in each Ray actor).
        os.environ["KEYNES_VERBOSE"] = "1"
        if not log_level_chosen():
            os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"


START_A_SERVER = "start a server (prefect server start) and export PREFECT_API_URL=http://127.0.0.1:4200/api"


def fail(message: str) -> None:
    """Print one line and exit with status 2. The message is printed as it is (a key such as
    ``[/]`` is no markup, ``:x:`` no emoji) and on one line."""

    console.print(Text.assemble(("error:", "bold red"), " ", " ".join(message.splitlines())), highlight=False, soft_wrap=True)
    raise typer.Exit(2)


class RichReporter:
    """Shows each round of each arm as a progress bar of agents."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def start(self, label: str, total: int, completed: int = 0) -> "_RichBar":
        return _RichBar(self.progress, self.progress.add_task(label, total=total, completed=completed))


class _RichBar:
    def __init__(self, progress: Progress, task_id):
        self.progress, self.task_id = progress, task_id

    def advance(self, n: int) -> None:
        self.progress.advance(self.task_id, n)

    def finish(self) -> None:
        self.progress.update(self.task_id, completed=self.progress.tasks[self.task_id].total)


def call_flow(flow: Any, *args: Any, attempts: int = 3) -> Any:
    """``flow(*args)``, begun again when Prefect's one-shot check at a flow's start found no API
    because the temporary API was being started again (``kept_alive``: it died a moment before).
    Nothing has run then; a run begun again resumes in any case."""
    from cli.runtime.temporary_api import UNREACHED, answering

    for attempt in range(attempts):
        try:
            return flow(*args)
        except RuntimeError as exc:
            if UNREACHED not in str(exc) or attempt == attempts - 1 or not answering(float(os.environ.get(STARTUP_TIMEOUT, 120))):
                raise
            console.print("Prefect's temporary API answers again; starting the flow again", highlight=False)
    raise AssertionError("unreachable")


def warm_stack(ray_address: str | None) -> Any:
    """The warm stack (``keynes up``) a command that starts Ray joins, if it is up and this keynes
    may join it (not when the config names a cluster, ``workers.ray_address``); one line says
    which, or why not. Its Prefect API serves this process from now on (unless
    ``PREFECT_API_URL`` is set): call it before anything imports Prefect's settings."""
    from cli.runtime.stack import for_command

    stack, line = for_command(ray_address)
    if line:
        console.print(line, highlight=False, soft_wrap=True)
    if stack is not None and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = stack.prefect_url
        if "prefect" in sys.modules:  # imported already: its settings read again
            import prefect.context

            prefect.context.refresh_global_settings_context()
    return stack


def report_login(host: str, credentials: Path | None, public: bool, prefix: str = "") -> str | dict[str, str] | None:
    """The login of a report server bound to ``host`` (reports/login.py); exit 2 with one line
    when it is shared with neither a login nor ``--public``, or its credentials file is bad."""
    from reports.login import LoginError, login_for

    try:
        return login_for(host, credentials, public, prefix)
    except LoginError as exc:
        fail(str(exc))


def port_taken(host: str, port: int) -> str | None:
    """None if ``host:port`` can be bound, else why not (one line)."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); choose another port"
    return None
