"""`keynes sql` and `keynes --help` import what they need and nothing heavier; `keynes run` prints
its first line before the validation stack is imported.

The data-frame, validation and orchestration stack (polars with pyarrow and numpy, pandas,
pandera, Prefect, Ray) costs 0.7 s to over a second of imports before a single SELECT; the
commands' start is budgeted in benchmarks/cli_start.py. Checked here from what ``python -X
importtime`` lists, with no timing: a fresh process per command, on a real warehouse file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO
from warehouse.files import WarehouseFile

pytestmark = pytest.mark.quick

HEAVY = {"pandera", "pandas", "polars", "pyarrow", "numpy", "prefect", "ray"}


def imported_by(*args: str) -> tuple[set[str], str]:
    """The top-level packages a ``keynes`` process imports (every import, lazy ones too), and its output."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli.app", *args],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    names = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    return {name.split(".")[0] for name in names}, result.stdout


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory):
    """A warehouse file with the current schema and views (made by the writer's own connection)."""
    path = tmp_path_factory.mktemp("imports") / "keynes.duckdb"
    with WarehouseFile(path).connect():
        pass
    return path


@pytest.mark.parametrize("format_", ["table", "csv", "json"])
def test_keynes_sql_imports_duckdb_not_the_data_frame_stack(warehouse, format_):
    modules, out = imported_by("sql", "--db", str(warehouse), "--format", format_,
                               "select (select count(*) from round_summary) as rounds, 40 + 2 as answer")
    assert {"duckdb", "typer", "rich", "warehouse"} <= modules  # the probe sees the command's imports
    assert "42" in out and "rounds" in out  # the query ran
    assert not modules & HEAVY, f"keynes sql imported {sorted(modules & HEAVY)}"


def test_keynes_help_imports_nothing_heavy():
    modules, out = imported_by("--help")
    assert "sql" in out and "typer" in modules
    assert not modules & HEAVY, f"keynes --help imported {sorted(modules & HEAVY)}"


def test_keynes_run_prints_its_first_line_before_the_validation_stack_is_imported(tmp_path, session_cli):
    """``keynes run`` itself, as a user starts it, up to its first line: what ``cli.app.run`` does
    before its header (the config, the warehouse's check, the watchdog, the prompt format, the
    progress hooks) leaves pandera and pandas (~0.6 s), Prefect and Ray to what comes after.

    ``python -X importtime`` and the command's ``KEYNES_TIMINGS`` phases share its stderr, in the
    order they happened: the modules listed before the ``cli: header`` phase are those imported
    before the header was printed. The command is then killed with what it started (its process
    group: it joins the session's Prefect API and Ray, so it starts neither)."""
    from cli.runtime.processes import TAG

    env, ray_address = session_cli
    env = {k: v for k, v in env.items() if k != TAG} | {"KEYNES_TIMINGS": "1", "KEYNES_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-X", "importtime", "-m", "cli.app", "run", "experiments/quickstart.yaml",
               "--db", str(tmp_path / "k.duckdb"), "--set", f"workers.ray_address={ray_address}"]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    before, rest = set(), []
    try:
        for line in process.stderr:
            if line.startswith("import time:"):
                before.add(line.rpartition("|")[2].strip())
            elif line.startswith("keynes-timing") and line.rstrip().endswith(" cli: header"):
                break
            else:
                rest.append(line)
        else:
            pytest.fail("keynes run ended without printing its header:\n" + "".join(rest)[-3000:])
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        process.stderr.close()
    # The probe saw the command's own path to its header: the config, the warehouse, the watchdog,
    # the prompt format, the progress hooks.
    assert {"design.loading", "warehouse.store", "cli.runtime.processes", "design.prompting", "tasks.progress"} <= before, sorted(before)
    heavy = {name.split(".")[0] for name in before} & {"pandera", "pandas", "prefect", "ray"}
    assert not heavy, f"keynes run imported {sorted(heavy)} before its first line"
