"""``keynes sql --format table``: a query's rows as a table that fits the terminal.

As DuckDB's own shell does: numbers right-aligned, at most ``MAX_ROWS`` rows (the first and last
halves of a longer result), and as many columns as fit the width, the others named below the
table. Every cell and name is plain text (a value such as ``[bold]`` is shown as it is, never read
as markup). ``--format csv`` or ``json`` give every row and column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from warehouse.readonly import Rows

#: Rows shown of a longer result: its first and last halves, with a row of "…" between.
MAX_ROWS = 40
#: Characters a text column asks for when deciding which columns fit (longer text wraps).
TEXT_WIDTH = 32
#: DuckDB's numeric types (without their parameters): right-aligned.
NUMERIC = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
           "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL"}


def narrow_table(**kwargs: Any) -> Table:
    """The CLI's tables (``keynes sql``, ``plan``, ``models list``): a rule under the heading and
    no frame, so that they fit an 80-column terminal."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True, **kwargs)


def cell(value) -> str:
    """A value as the table shows it: nulls empty, floats to 6 significant digits."""
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def result_table(rows: Rows, width: int) -> tuple[Table, list[str]]:
    """The table of ``rows`` for a console ``width`` characters wide, and the lines to print
    under it (rows and columns left out, an empty result)."""
    values = rows.values
    shown = values if len(values) <= MAX_ROWS else [*values[: MAX_ROWS // 2], None, *values[-(MAX_ROWS // 2):]]
    cells = [None if row is None else [cell(v) for v in row] for row in shown]
    # Each column asks for its name or its widest cell (text up to TEXT_WIDTH: longer wraps), and
    # 3 characters of border and padding: keep the columns that fit, at least one.
    fits = 0
    used = 1
    for i, name in enumerate(rows.columns):
        widest = max((len(line) for r in cells if r is not None for line in r[i].splitlines() or [""]), default=0)
        need = max(len(name), min(widest, max(TEXT_WIDTH, len(name)))) + 3
        if fits and used + need > width:
            break
        fits, used = fits + 1, used + need
    table = narrow_table(show_header=True, header_style="bold")
    for name, type_ in zip(rows.columns[:fits], rows.types[:fits]):
        numeric = type_.split("(")[0] in NUMERIC
        table.add_column(Text(name), justify="right" if numeric else "left", overflow="fold")
    for r in cells:
        table.add_row(*(Text("…") if r is None else Text(c) for c in (r or [""] * fits)[:fits]))
    notes = ["0 rows"] if not values and rows.columns else []
    left_out = []
    if len(values) > MAX_ROWS:
        left_out.append(f"{len(values):,} rows ({MAX_ROWS} shown: the first and last {MAX_ROWS // 2})")
    hidden = rows.columns[fits:]
    if hidden:
        left_out.append(f"{len(hidden)} more column{'s' if len(hidden) > 1 else ''}, too wide to show: {', '.join(hidden)}")
    if left_out:
        left_out.append("--format csv or json gives every row and column")
    return table, notes + left_out

