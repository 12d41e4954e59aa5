"""Reading a test's warehouse with plain DuckDB: an independent reader of what keynes wrote."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import duckdb


def q(path: str | Path, sql: str, params: list | None = None) -> list[tuple]:
    """Run ``sql`` on the DuckDB file at ``path`` (read-only) and return every row."""
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute(sql, params).fetchall() if params is not None else con.execute(sql).fetchall()


@contextmanager
def held_when(path: str | Path, sql: str, ready: Callable[[Any], bool], timeout_s: float, what: str) -> Iterator[Any]:
    """Hold the warehouse file open, read-only, from the first look at which ``sql``'s value is
    ``ready`` until the block ends; the block gets that value.

    A writer (``keynes run``) opens the file for each commit and waits while another process holds
    it (warehouse/files.py), so while the block runs nothing more is committed: every reader the
    block starts sees exactly the value it got. Give the writer a lock timeout
    (``KEYNES_LOCK_TIMEOUT_S``) longer than the block. Until the file exists, holds the table, or
    the writer lets go of it, the value is None.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        con = None
        value = None
        try:
            if Path(path).exists():
                con = duckdb.connect(str(path), read_only=True)
                value = con.execute(sql).fetchone()[0]
        except (duckdb.IOException, duckdb.CatalogException):  # the writer holds the file; no schema yet
            value = None
            if con is not None:
                con.close()
                con = None
        try:
            ok = value is not None and ready(value)
        except BaseException:  # ``ready`` may fail the test (e.g. on a writer that already finished)
            if con is not None:
                con.close()
            raise
        if ok:
            try:
                yield value
            finally:
                con.close()
            return
        if con is not None:
            con.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last value: {value})")
        time.sleep(0.05)
