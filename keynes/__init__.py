"""keynes as a library: the warehouse's results in Python (a notebook, a script), as polars frames.

    import keynes
    keynes.query("select arm, round, mean, target from round_summary", db="keynes.duckdb")

Each call opens the DuckDB file read-only, runs one query and closes the file before it returns,
waiting while ``keynes run`` commits (up to ``KEYNES_LOCK_TIMEOUT_S``): a notebook left open never
holds up a run. ``import keynes`` imports DuckDB and the warehouse's schema only; polars is imported
by the first query. Knows nothing about Prefect, Ray or the engines.
"""

from __future__ import annotations

from keynes.reader import QueryError, Reader, WarehouseError, connect, query, tables

__all__ = ["QueryError", "Reader", "WarehouseError", "connect", "query", "tables"]
