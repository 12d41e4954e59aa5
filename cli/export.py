"""``keynes export``: every table of the warehouse as files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import fail, out


def export_tables(
    directory: Annotated[Path, typer.Argument(help="The folder to write (created if missing).")],
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
    format_: Annotated[str, typer.Option("--format", help="File format: parquet or csv.")] = "parquet",
    views: Annotated[bool, typer.Option("--views/--no-views", help="Also write every named view.")] = False,
) -> None:
    """Write every table of the warehouse to DIRECTORY, one file per table (read-only).

    Example: keynes export --format parquet out/
    """
    from warehouse.export import FORMATS, export
    from warehouse.store import Warehouse, WarehouseError

    if format_ not in FORMATS:
        fail(f"--format: {format_!r} is not one of {', '.join(FORMATS)}")
    if not db.exists():
        fail(f"--db: {str(db)!r} does not exist")
    try:
        for item in export(Warehouse(db), directory, format_, views=views):
            out.print(f"{item.path}  {item.rows:,} rows", highlight=False)
    except WarehouseError as exc:
        fail(str(exc))
