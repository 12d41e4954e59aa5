"""Read-only queries of a warehouse file that never hold it between calls.

A DuckDB connection left open (``duckdb.connect("keynes.duckdb")`` in a notebook) locks the file:
``keynes run`` cannot commit, waits its lock timeout and fails. ``Reader`` opens the file for one
query and closes it before returning, through the same machinery keynes' own readers use
(``warehouse.files.WarehouseFile``): retried while a run commits, an older file upgraded once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from warehouse.files import WarehouseError, WarehouseFile, frame_of
from warehouse.views import CATALOG

if TYPE_CHECKING:
    import polars as pl

__all__ = ["QueryError", "Reader", "WarehouseError", "connect", "query", "tables"]

DEFAULT_DB = "keynes.duckdb"

class QueryError(WarehouseError):
    """The SQL cannot run (a syntax error, an unknown table or column, a write on the read-only file)."""


class Reader:
    """A warehouse file to query: each call opens it read-only, runs, and closes it.

    Args:
        db: the DuckDB file ``keynes run`` writes (``--db``, or ``db:`` in the config).
        lock_timeout_s: how long a call waits while a writer holds the file
            (default: ``KEYNES_LOCK_TIMEOUT_S`` or 60 s); a run holds it for a commit, milliseconds.

    Example:
        >>> results = keynes.connect("keynes.duckdb")
        >>> results.query("select arm, round, mean from round_summary where round = ?", [1])
    """

    def __init__(self, db: str | Path = DEFAULT_DB, lock_timeout_s: float | None = None):
        self._file = WarehouseFile(db, lock_timeout_s)

    @property
    def path(self) -> Path:
        """The warehouse file."""
        return self._file.path

    def query(self, sql: str, params: list[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
        """Run one SQL statement and return its result as a polars frame (an empty frame for a
        statement without a result). ``?`` or ``$name`` placeholders take ``params``.

        Raises:
            WarehouseError: no such file, not a keynes warehouse, or held by a writer past the timeout.
            QueryError: the SQL cannot run; one line, DuckDB's own.
        """
        try:
            with self._file.connect(read_only=True) as con:
                return frame_of(con, sql, params)
        except duckdb.Error as exc:
            raise QueryError(_one_line(exc)) from None

    sql = query  # DuckDB's name for it

    def tables(self) -> pl.DataFrame:
        """Every table and named view of the warehouse: ``name``, ``kind`` (table or view) and the
        ``comment`` that says what it holds."""
        return self.query(CATALOG)

    def __repr__(self) -> str:
        return f"keynes.connect({str(self.path)!r})"


def connect(db: str | Path = DEFAULT_DB, lock_timeout_s: float | None = None) -> Reader:
    """The warehouse file at ``db`` to query read-only, opened afresh by each call (``Reader``).
    Nothing is opened here: a missing file is reported by the first query."""
    return Reader(db, lock_timeout_s)


def query(sql: str, db: str | Path = DEFAULT_DB, params: list[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
    """Run ``sql`` on the warehouse file ``db``, read-only, and return a polars frame; the file is
    closed before this returns (``Reader.query``).

    Example:
        >>> keynes.query("select prompt_mode, round, mean from guess_stats_by_prompt_mode order by 1, 2")
    """
    return Reader(db).query(sql, params)


def tables(db: str | Path = DEFAULT_DB) -> pl.DataFrame:
    """The tables and named views of the warehouse file ``db``, each with what it holds (``Reader.tables``)."""
    return Reader(db).tables()


def _one_line(exc: duckdb.Error) -> str:
    """DuckDB's message on one line: its first line, and its suggestion (``Did you mean "rounds"?``) if it makes one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    hint = next((line for line in lines[1:] if line.startswith("Did you mean")), None)
    return " ".join([lines[0], hint] if hint else lines[:1])
