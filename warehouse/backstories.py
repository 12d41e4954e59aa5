"""The backstory cache: LLM-written persona backgrounds, keyed so any run can reuse them.

A key hashes (persona attributes, template hash, model, seed, sampling); a rerun, or
another experiment over the same population, finds its backstories here instead of
generating them again. Writes skip keys already stored, so a retried batch is harmless.
"""

from __future__ import annotations

import polars as pl

from warehouse.files import frame_of
from warehouse.store import Warehouse
from warehouse.validation import BackstoryRows

#: Column order of the backstories table (created_at is filled by DuckDB).
BACKSTORY_COLUMNS = list(BackstoryRows.to_schema().columns)


def read_backstories(warehouse: Warehouse, keys: pl.Series) -> pl.DataFrame:
    """The cached backstories of these keys: ``key``, ``background`` (missing keys absent)."""
    with warehouse.connect() as con:
        con.register("wanted", pl.DataFrame({"key": keys.unique()}).to_arrow())
        frame = frame_of(con, "SELECT b.key, b.background FROM backstories b JOIN wanted w USING (key)")
        con.unregister("wanted")
    return frame


def write_backstories(warehouse: Warehouse, rows: pl.DataFrame) -> int:
    """Store generated backstories (validated); keys already stored are skipped.

    Returns the number of new rows.
    """
    frame = BackstoryRows.validate(rows.select(BACKSTORY_COLUMNS), lazy=True)
    columns = ", ".join(BACKSTORY_COLUMNS)
    with warehouse.transaction() as con:
        before = con.execute("SELECT count(*) FROM backstories").fetchall()[0][0]
        con.register("new_backstories", frame.to_arrow())
        con.execute(
            f"""INSERT INTO backstories ({columns}) SELECT {columns} FROM new_backstories n
                WHERE NOT EXISTS (SELECT 1 FROM backstories b WHERE b.key = n.key)"""
        )
        con.unregister("new_backstories")
        after = con.execute("SELECT count(*) FROM backstories").fetchall()[0][0]
    return after - before


def count_backstories(warehouse: Warehouse) -> int:
    """How many backstories the cache holds."""
    with warehouse.connect() as con:
        return con.execute("SELECT count(*) FROM backstories").fetchall()[0][0]
