"""Export the warehouse: every table (and optionally every view) as Parquet or CSV files.

Reads through a read-only connection, so it works while a run is writing; DuckDB's own
``COPY ... TO`` does the writing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warehouse.store import Warehouse

FORMATS = ("parquet", "csv")


@dataclass(frozen=True)
class Exported:
    """One written file: the table or view it holds, its path and its rows."""

    name: str
    path: Path
    rows: int


def export(warehouse: Warehouse, out_dir: str | Path, format: str = "parquet", views: bool = False) -> list[Exported]:
    """Write every table of the warehouse to ``out_dir/<table>.<format>``.

    Args:
        warehouse: the warehouse to read.
        out_dir: the folder to write (created if missing).
        format: ``parquet`` or ``csv``.
        views: also write every named view (see ``warehouse.views``).

    Returns:
        The files written, tables first, in name order.

    Raises:
        ValueError: an unknown format.
    """
    if format not in FORMATS:
        raise ValueError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Exported] = []
    with warehouse.connect(read_only=True) as con:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY table_name").fetchall()]
        names = tables + ([r[0] for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' ORDER BY view_name").fetchall()]
            if views else [])
        options = "FORMAT parquet, COMPRESSION zstd" if format == "parquet" else "FORMAT csv, HEADER true"
        for name in names:
            path = out / f"{name}.{format}"
            con.execute(f"COPY (SELECT * FROM \"{name}\") TO '{_quote(path)}' ({options})")
            rows = con.execute(f'SELECT count(*) FROM "{name}"').fetchall()[0][0]
            written.append(Exported(name, path, rows))
    return written


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")
