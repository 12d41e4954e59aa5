"""``keynes.query`` and ``keynes.connect``: results as polars frames, the file closed between calls,
errors in one line, and an import that brings no orchestration.

The warehouse is filled through the real store (tests/warehouse/conftest.py); other processes are
real processes opening the same file.
"""

from __future__ import annotations

import subprocess
import sys
import time

import duckdb
import polars as pl
import pytest

import keynes
from tests.conftest import REPO
from warehouse.files import WarehouseFile

pytestmark = pytest.mark.quick


@pytest.fixture
def db(filled):
    return filled


def python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_a_query_returns_the_rows_as_a_polars_frame(db):
    sql = "select arm, round, mean, target from round_summary order by arm, round"
    frame = keynes.query(sql, db=db)
    with duckdb.connect(str(db), read_only=True) as con:
        expected = con.execute(sql).fetchall()
    assert isinstance(frame, pl.DataFrame)
    assert frame.columns == ["arm", "round", "mean", "target"]
    assert frame.rows() == expected and len(expected) == 9


def test_placeholders_take_a_list_or_a_dict(db):
    results = keynes.connect(db)
    by_list = results.query("select count(*) as n from guesses where round = ? and valid", [2])
    by_name = results.sql("select count(*) as n from guesses where round = $round and valid", {"round": 2})
    assert by_list.equals(by_name) and 0 < by_list.item() < 3 * 400


def test_the_file_is_free_for_a_writer_between_calls(db, tmp_path):
    """After each call another process opens the file read-write at once: nothing is held."""
    path = tmp_path / "copy.duckdb"
    path.write_bytes(db.read_bytes())
    results = keynes.connect(path)
    for i in range(2):
        assert results.query("select count(*) from duckdb_tables() where table_name like 'note_%'").item() == i
        write = python(f"import duckdb; con = duckdb.connect({str(path)!r}); con.execute('create table note_{i} (x int)'); con.close()")
        assert write.returncode == 0, write.stderr


def test_tables_lists_tables_and_views_with_what_they_hold(db):
    listed = keynes.tables(db)
    assert listed.columns == ["name", "kind", "comment"]
    kinds = dict(zip(listed["name"], listed["kind"]))
    assert kinds["guesses"] == "table" and kinds["round_summary"] == "view" and kinds["guess_histogram"] == "view"
    comment = listed.filter(pl.col("name") == "round_summary")["comment"].item()
    assert comment.startswith("One row per arm and round") and "[keynes:" not in comment


def test_a_missing_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nowhere.duckdb"
    with pytest.raises(keynes.WarehouseError) as caught:
        keynes.query("select 1", db=missing)
    assert str(caught.value) == f"{missing}: no such warehouse (run an experiment first)"
    assert not missing.exists()


@pytest.mark.parametrize("sql, expected", [
    ("selec 1", 'Parser Error: syntax error at or near "selec"'),
    ("select * from round_sumary", 'Catalog Error: Table with name round_sumary does not exist! Did you mean "round_summary"?'),
    ("delete from guesses", 'Cannot execute statement of type "DELETE"'),
])
def test_sql_that_cannot_run_is_one_line(db, sql, expected):
    with pytest.raises(keynes.QueryError) as caught:
        keynes.query(sql, db=db)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message
    assert isinstance(caught.value, keynes.WarehouseError)  # one except clause catches both


def test_a_statement_without_a_result_gives_an_empty_frame(db):
    assert keynes.query("set threads = 1", db=db).height == 0
    assert keynes.query("select count(*) from guesses", db=db).item() == 3 * 3 * 400  # nothing was deleted above


def test_import_keynes_brings_duckdb_and_no_orchestration(db):
    probe = ("import sys, keynes\nbefore = set(sys.modules)\n"
             f"keynes.query('select 1', db={str(db)!r})\n"
             "print(sorted({m.split('.')[0] for m in before}))\nprint(sorted({m.split('.')[0] for m in sys.modules}))")
    result = python(probe)
    assert result.returncode == 0, result.stderr
    at_import, after_query = (set(eval(line)) for line in result.stdout.splitlines())
    assert {"duckdb", "warehouse", "keynes"} <= at_import
    assert not at_import & {"polars", "pandas", "pandera", "prefect", "ray", "numpy", "engines", "flows", "tasks"}, at_import
    assert "polars" in after_query and not after_query & {"pandas", "pandera", "prefect", "ray", "flows", "tasks"}, after_query
