"""`keynes sql` and `keynes --help` import what they need and nothing heavier; `keynes run` prints
its first line before the validation stack is imported.

The data-frame, validation and orchestration stack (polars with pyarrow and numpy, pandas,
pandera, Prefect, Ray) costs 0.7 s to over a second of imports before a single SELECT; the
commands' start is budgeted in benchmarks/cli_start.py. Checked here from what ``python -X
importtime`` lists, with no timing: a fresh process per command, on a real warehouse file.
"""

from __future__ import annotations

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


def test_keynes_run_checks_its_config_and_warehouse_without_pandas(tmp_path):
    """What ``keynes run`` does before its first line (``cli.app.run``: the config, the
    warehouse's check, the prompt format) leaves pandera and pandas (~0.6 s) to the rows' writes."""
    probe = f"""
import sys
from design.loading import load_config
from design.prompting import check_prompting
from warehouse.store import Warehouse
cfg = load_config("experiments/quickstart.yaml", ["db={tmp_path / 'k.duckdb'}"])
Warehouse(cfg.db).check_writable()
check_prompting(cfg, cfg.arms_list())
print(sorted(name for name in ("pandera", "pandas", "prefect", "ray") if name in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout
