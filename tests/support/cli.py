"""``keynes`` in this process (typer's runner: the same code as the ``keynes`` script).

A pytest worker may hold a local Ray that another test started; Ray's log monitor forwards
its processes' error lines (``(raylet) … is over 95% full``) to this process's stderr,
whatever command is running. ``invoke`` keeps only what the command itself printed: a
refusal's one line stays one line. A ``keynes`` process of its own never sees them: its
config is refused before Ray starts.
"""

from __future__ import annotations

import re

from click.testing import Result
from typer.testing import CliRunner

from cli.app import app

# Ray's prefix on a forwarded line, e.g. "\x1b[33m(raylet)\x1b[0m" or "(Shard pid=123)".
RAY_FORWARDED = re.compile(r"^(\x1b\[[0-9;]*m)?\((raylet|gcs_server|([\w.]+ )?pid=\d+[^)]*)\)(\x1b\[0m)?\s")


def invoke(*args: str) -> tuple[Result, list[str]]:
    """Run ``keynes ARGS``: (the result, its stderr's non-empty lines but Ray's forwarded ones)."""
    result = CliRunner().invoke(app, list(args))
    lines = [line for line in result.stderr.splitlines() if line.strip() and not RAY_FORWARDED.match(line)]
    return result, lines
