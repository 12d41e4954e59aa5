"""Reading a test's warehouse with plain DuckDB: an independent reader of what keynes wrote."""

from __future__ import annotations

from pathlib import Path

import duckdb


def q(path: str | Path, sql: str, params: list | None = None) -> list[tuple]:
    """Run ``sql`` on the DuckDB file at ``path`` (read-only) and return every row."""
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()
