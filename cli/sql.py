"""``keynes sql``: query the warehouse, read-only (also while a run writes it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, out
from cli.table import result_table


def sql(
    query: Annotated[str, typer.Argument(help="The SQL to run (read-only).")],
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
    format_: Annotated[str, typer.Option("--format", help="Output format: table, csv or json.")] = "table",
) -> None:
    """Query the warehouse read-only (works while a run is writing).

    Example: keynes sql "select round, mean, target from rounds order by round"
    """
    import duckdb

    # DuckDB alone, no polars, pandas or pandera: a SELECT starts as fast as DuckDB does
    # (guarded by tests/flows/test_cli_imports.py).
    from warehouse.readonly import WarehouseError, query_rows

    if format_ not in ("table", "csv", "json"):
        fail(f"--format: {format_!r} is not one of table, csv, json")
    try:
        rows = query_rows(db, query)
    except WarehouseError as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(str(exc).splitlines()[0])
    except OSError as exc:  # a --db name the file system refuses (too long)
        fail(f"--db: {str(db)!r}: {exc.strerror or exc}")
    if format_ == "csv":
        sys.stdout.write(rows.csv())
    elif format_ == "json":
        sys.stdout.write(rows.json() + "\n")
    else:
        table, notes = result_table(rows, out.width)
        out.print(table)
        for note in notes:
            out.print(note, highlight=False)
