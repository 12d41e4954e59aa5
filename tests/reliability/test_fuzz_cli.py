"""Fuzzed input to the real commands: ``keynes run``, ``keynes sql`` and ``keynes report``.

Each case invokes the command in this process (typer's runner: the same code as the
``keynes`` script) against a real warehouse file (tests/warehouse/conftest.py's ``fill``).
A refused input exits 2 with exactly one line and no traceback, and the file's sha256 is
unchanged; ``keynes sql`` never changes it, whatever it is asked. A few generated valid
configs run end to end at a tiny size on the simulated engine.
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import duckdb
import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from tests.reliability.fuzz import TEXT
from tests.reliability.test_fuzz_config import OVERRIDE_KEYS, OVERRIDE_VALUES, valid_configs, yaml_texts
from tests.support.cli import invoke
from tests.warehouse.conftest import EXPERIMENT, fill


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def keynes(*args: str) -> tuple[int, list[str], str]:
    """Run a command in this process: (exit code, stderr's non-empty lines, stdout). A
    traceback (any exception but the exit) fails the test."""
    result, lines = invoke(*args)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, lines, result.stdout


def refused(code: int, lines: list[str]) -> str:
    """The one line of a refusal (exit 2), without its ``error: ``."""
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, lines)
    return lines[0].removeprefix("error: ")


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> tuple[Path, str]:
    """A real warehouse with one experiment (three arms, three rounds): (file, sha256)."""
    db = tmp_path_factory.mktemp("fuzz-cli") / "keynes.duckdb"
    fill(db)
    return db, digest(db)


_serial = itertools.count()


# --------------------------------------------------------------------------- keynes run
@pytest.mark.quick
@settings(max_examples=40)
@given(yaml_texts(), st.lists(st.builds(lambda k, v: f"{k}={v}", OVERRIDE_KEYS, OVERRIDE_VALUES), max_size=2))
@example("name: x\n'[/]': 1\n", [])  # rich read the key as markup: MarkupError
@example("name: x\n'[bold]x': 1\n", [])  # ... and swallowed it
def test_keynes_run_refuses_bad_configs_in_one_line_and_leaves_the_warehouse(warehouse, text, overrides):
    from design.config import ConfigError
    from design.loading import load_config

    db, before = warehouse
    config = db.parent / f"c{next(_serial)}.yaml"
    config.write_text(text, encoding="utf-8", errors="surrogatepass")
    sets = [a for item in overrides for a in ("--set", item)]
    try:  # only configs refused before the warehouse is opened (valid ones run: below)
        load_config(config, [*overrides, f"db={db}"])
        assume(False)
    except ConfigError as exc:
        expected = " ".join(str(exc).splitlines())
    assert refused(*keynes("run", str(config), "--db", str(db), *sets)[:2]) == expected
    assert digest(db) == before


# --------------------------------------------------------------------------- keynes sql
SQL_WORDS = [
    "select", "*", "from", "guesses", "rounds", "round_summary", "runs", "where", "round", "=", "1", "'x'", "(", ")", ",", ";",
    "--", "/*", "*/", "order by", "limit", "-1", "group by", "having", "union", "count(*)", "avg(guess)", "join", "on",
    "insert into guesses values (1)", "drop table guesses", "delete from rounds", "update runs set status = 'x'",
    "create table t (a int)", "create temp table t (a int)", "alter table runs add column x int", "checkpoint", "vacuum",
    "pragma database_list", "set threads = 1", "begin", "commit", "rollback", "describe", "show tables", "summarize rounds",
    "explain", "[/]", "[bold]", ":smile:", "\x00", "'", '"', "\\", "名前", "1e400", "9" * 40, "::", "blob", "[1, 2]",
    "{'a': 1}", "map {1: 2}", "interval 1 day", "uuid()", "'nan'::double", "1.5::decimal(38, 10)", "null",
]
SQL = st.one_of(st.lists(st.sampled_from(SQL_WORDS), min_size=1, max_size=8).map(" ".join), TEXT)


@pytest.mark.quick
@settings(max_examples=80)
@given(SQL, st.sampled_from(["table", "csv", "json", "xml", ""]))
@example('select * from "[/]"', "table")  # DuckDB's message names the table: rich read it as markup (MarkupError)
@example("--", "table")
@example("""select '[/]' as "[bold]" """, "table")  # a value and a name that rich would read as markup (MarkupError)
def test_keynes_sql_answers_or_says_why_in_one_line_and_never_writes(warehouse, query, format_):
    db, before = warehouse
    code, lines, _ = keynes("sql", "--db", str(db), "--format", format_, "--", query)  # "--": a query may start with "-"
    assert code == 0 and not lines or refused(code, lines)
    assert digest(db) == before


@pytest.mark.quick
def test_keynes_sql_with_a_db_name_the_file_system_refuses(tmp_path):
    db = tmp_path / ("d" * 300)
    assert refused(*keynes("sql", "--db", str(db), "select 1")[:2]) == f"--db: {str(db)!r}: File name too long"


# --------------------------------------------------------------------------- keynes report
@pytest.mark.quick
@settings(max_examples=30)
@given(st.lists(st.one_of(st.sampled_from([EXPERIMENT, "views", "nope", "", "[/]", "a\nb", "'; drop table runs; --"]), TEXT), max_size=2),
       st.sampled_from(["good", "no folder", "a folder", "too long", "newline"]),
       st.sampled_from(["good", "missing", "a folder", "too long", "not duckdb", "empty"]))
@example(["[/]"], "good", "good")  # MarkupError
@example([EXPERIMENT], "too long", "good")  # OSError: File name too long
@example([], "a folder", "good")  # IsADirectoryError after building the page
@example([], "good", "too long")  # OSError: File name too long
def test_keynes_report_arguments_refused_in_one_line(warehouse, experiments, out, db_kind):
    db, before = warehouse
    folder = db.parent
    good = db_kind == "good" and out == "good" and all(e in (EXPERIMENT, "views") for e in experiments)
    assume(not good)  # a page that can be built is built (tests/reports/)
    (folder / "notes.duckdb").write_text("my notes\n")
    paths = {"good": db, "missing": folder / "missing.duckdb", "a folder": folder, "too long": folder / ("d" * 300),
             "not duckdb": folder / "notes.duckdb", "empty": Path("")}
    outs = {"good": folder / "r.html", "no folder": folder / "nowhere" / "r.html", "a folder": folder,
            "too long": folder / ("r" * 300 + ".html"), "newline": folder / "a\nb" / "r.html"}
    args = [a for e in experiments for a in ("--experiment", e)]
    refused(*keynes("report", "--db", str(paths[db_kind]), "--out", str(outs[out]), *args)[:2])
    assert digest(db) == before
    assert not (folder / "r.html").exists()


# --------------------------------------------------------------------------- valid configs run
@pytest.mark.slow
@settings(max_examples=3)
@given(valid_configs())
def test_generated_valid_configs_run_at_a_tiny_size(tmp_path_factory, prefect_api, local_ray, data):
    folder = tmp_path_factory.mktemp("fuzz-run")
    data = {**data, "report": {"enabled": False}, "workers": {"actors": 1, "shard_size": 4}, "continue": False}
    config = folder / "valid.yaml"
    config.write_text(yaml.safe_dump(data))
    db = folder / "keynes.duckdb"
    code, lines, _ = keynes("run", str(config), "--db", str(db))
    assert code == 0 and "done: " in " ".join(lines), lines
    from design.loading import load_config

    cfg = load_config(config, [f"db={db}"])
    arms = cfg.arms_list()
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("select count(*) from guesses").fetchone()[0]
    assert stored == cfg.population.size * sum(a.rule.rounds for a in arms)
