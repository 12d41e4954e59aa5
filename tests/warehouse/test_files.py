"""The warehouse file: upgrades of older files, clear refusals, the stock CLI, Parquet export."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import duckdb
import polars as pl
import pytest

from tests.conftest import REPO
from tests.warehouse.conftest import fill
from warehouse.schema import MIGRATIONS, SCHEMA_VERSION


def keynes(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_an_older_file_without_views_is_upgraded_when_read(tmp_path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:  # a file as the first keynes release wrote it
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute(MIGRATIONS[0])
        con.execute("INSERT INTO schema_version VALUES (1)")
        con.execute("INSERT INTO rounds VALUES ('r', 1, 10, 9, 50, 50, 1, 33.3333, 33, 1, 0.5)")
    result = keynes("sql", "--db", str(path), "--format", "csv", "select count(*) as n from round_summary")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["n", "0"]  # the view exists now (no runs row to join)
    with duckdb.connect(str(path), read_only=True) as con:
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    assert {"round_summary", "guess_stats_by_attribute", "usage_by_arm"} <= views


def test_a_newer_file_is_refused_with_one_clear_line(tmp_path):
    path = tmp_path / "new.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        con.execute(f"INSERT INTO schema_version VALUES ({SCHEMA_VERSION + 1})")
    result = keynes("sql", "--db", str(path), "select 1")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"schema version {SCHEMA_VERSION + 1}, newer than this keynes" in lines[0], result.stderr


def test_a_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "other.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE sales (x INTEGER)")
    result = keynes("sql", "--db", str(path), "select 1")
    assert result.returncode == 2 and "not a keynes warehouse" in result.stderr


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("files") / "small.duckdb"
    fill(path)
    return path


def stock_duckdb() -> list[str]:
    """The stock DuckDB shell that the dev dependencies install (the `duckdb-cli` package puts a
    `duckdb` command next to this interpreter): nothing is downloaded while the tests run."""
    shell = Path(sysconfig.get_path("scripts")) / "duckdb"
    if not shell.exists():
        pytest.fail(f"no DuckDB shell at {shell}: install the dev dependencies (`uv sync` installs the duckdb-cli package)")
    return [str(shell)]


def test_the_file_opens_in_the_stock_duckdb_cli(small):
    query = "SELECT arm, round, round(target, 4) AS t FROM round_summary ORDER BY arm, round"
    result = subprocess.run([*stock_duckdb(), "-readonly", "-csv", str(small), "-c", query],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(small), read_only=True) as con:
        expected = con.execute(query).fetchall()
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "arm,round,t"
    assert [tuple(float(x) for x in line.split(",")) for line in lines[1:]] == [tuple(map(float, r)) for r in expected]
    result = subprocess.run([*stock_duckdb(), "-readonly", "-csv", str(small), "-c",
                             "SELECT count(DISTINCT attribute) FROM persona_attributes"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == "4", result.stderr


def test_export_writes_every_table_as_parquet(small, tmp_path):
    out = tmp_path / "parquet"
    result = keynes("export", "--db", str(small), "--format", "parquet", str(out))
    assert result.returncode == 0, result.stderr
    with duckdb.connect(str(small), read_only=True) as con:
        tables = {r[0]: con.execute(f'SELECT count(*) FROM "{r[0]}"').fetchall()[0][0]
                  for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        guesses = pl.from_arrow(con.sql("SELECT * FROM guesses ORDER BY run_id, round, agent_id").to_arrow_table())
    assert {p.stem for p in out.glob("*.parquet")} == set(tables)
    for name, rows in tables.items():
        assert pl.read_parquet(out / f"{name}.parquet").height == rows, name
    exported = pl.read_parquet(out / "guesses.parquet").sort("run_id", "round", "agent_id")
    assert exported.equals(guesses)


def test_export_rejects_an_unknown_format(small, tmp_path):
    result = keynes("export", "--db", str(small), "--format", "xlsx", str(tmp_path / "x"))
    assert result.returncode == 2 and "--format: 'xlsx' is not one of parquet, csv" in result.stderr


def test_a_held_file_is_opened_once_and_free_for_other_processes_after(tmp_path, monkeypatch):
    from warehouse.files import WarehouseFile
    from warehouse.store import Warehouse

    path = tmp_path / "held.duckdb"
    warehouse = Warehouse(path)
    opened = []
    real = WarehouseFile._open
    monkeypatch.setattr(WarehouseFile, "_open", lambda self, *a, **k: opened.append(a) or real(self, *a, **k))
    with warehouse.held():
        with warehouse.held():  # nested: the outer block holds
            warehouse.begin_experiment("e", "held", {}, "h", 1, 2)
            # A new demographic column inside the block: the persona views follow it.
            warehouse.write_personas("e", pl.DataFrame({"agent_id": [0, 1], "education": ["a", "b"]}))
        assert Warehouse(path).query("select attribute, count(*) n from persona_attributes group by 1").rows() == [("education", 2)]
        assert warehouse.statuses("e") == {"running"}
        # Another process cannot open the file while it is held…
        blocked = subprocess.run([sys.executable, "-c", f"import duckdb; duckdb.connect({str(path)!r}, read_only=True)"],
                                 capture_output=True, text=True)
        assert blocked.returncode != 0 and "lock" in blocked.stderr.lower()
    assert len(opened) == 1
    # …and can once the block ends.
    after = subprocess.run([sys.executable, "-c", f"import duckdb; print(duckdb.connect({str(path)!r}, read_only=True)"
                            ".sql('select count(*) from personas').fetchall())"], capture_output=True, text=True)
    assert after.returncode == 0 and after.stdout.strip() == "[(2,)]", after.stderr
