"""`keynes sql --format table` in a terminal: numbers right-aligned, a long result's first and last
rows, the columns that fit and the names of the others, every value shown as it is."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli.app import app
from cli.table import MAX_ROWS
from warehouse.readonly import query_rows

pytestmark = pytest.mark.quick


def sql(monkeypatch, db, query: str, width: int = 80) -> list[str]:
    monkeypatch.setattr("cli.sql.out", Console(width=width))
    result = CliRunner().invoke(app, ["sql", "--db", str(db), query])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= width, result.stdout
    return lines


def test_a_wide_result_shows_the_columns_that_fit_and_names_the_others(filled, monkeypatch):
    columns = query_rows(filled.path, "select * from round_summary limit 0").columns
    lines = sql(monkeypatch, filled.path, "select * from round_summary")
    shown = lines[0].split()
    assert shown == columns[: len(shown)] and 0 < len(shown) < len(columns), lines[0]
    note = " ".join(x.strip() for x in lines[lines.index(next(x for x in lines if "more column" in x)):])
    hidden = columns[len(shown):]
    assert f"{len(hidden)} more columns, too wide to show: {', '.join(hidden)}" in note, note
    assert "--format csv or json gives every row and column" in note
    # a terminal wide enough shows them all, and says nothing more
    wide = sql(monkeypatch, filled.path, "select * from round_summary", width=400)
    assert wide[0].split() == columns and not any("more column" in x or "--format" in x for x in wide)


def test_a_long_result_shows_its_first_and_last_rows(filled, monkeypatch):
    lines = sql(monkeypatch, filled.path, "select range as i, range * 2 as twice from range(100)")
    body = [line.split() for line in lines[2:2 + MAX_ROWS + 1]]
    half = MAX_ROWS // 2
    assert body == [[str(i), str(2 * i)] for i in range(half)] + [["…", "…"]] + [[str(i), str(2 * i)] for i in range(100 - half, 100)]
    assert lines[2 + MAX_ROWS + 1:] == [f"100 rows ({MAX_ROWS} shown: the first and last {half})",
                                        "--format csv or json gives every row and column"]
    # exactly MAX_ROWS rows: all of them, no note
    assert len(sql(monkeypatch, filled.path, f"select range from range({MAX_ROWS})")) == 2 + MAX_ROWS


def test_numbers_are_right_aligned_and_text_left(filled, monkeypatch):
    lines = sql(monkeypatch, filled.path, "select * from (values (5, 'a', 1.5::double), (12345, 'bbbbb', 10.25::double)) t(n, word, x)")
    header, first, second = lines[0], lines[2], lines[3]
    assert first.index("5 ") + 1 == second.index("12345") + 5 == header.index("n") + 1  # right edges of the number column
    assert first.index("a") == second.index("bbbbb") == header.index("word")  # left edges of the text column
    assert first.rstrip().endswith("1.5") and second.rstrip().endswith("10.25")


def test_values_and_names_that_look_like_markup_are_shown_as_they_are(filled, monkeypatch):
    lines = sql(monkeypatch, filled.path, """select '[bold]x' as "[/]", '[red]' as ":smile:" """)
    assert lines[0].split() == ["[/]", ":smile:"] and lines[2].split() == ["[bold]x", "[red]"], lines


def test_an_empty_result_says_so(filled, monkeypatch):
    lines = sql(monkeypatch, filled.path, "select run_id, round from rounds where false")
    assert lines[0].split() == ["run_id", "round"] and lines[-1] == "0 rows", lines
