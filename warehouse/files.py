"""The warehouse file: connections, locking and schema migrations.

The writer opens the DuckDB file only for the length of a commit, so readers
(``keynes sql``, reports) can open it read-only between commits; both sides retry
briefly when the other holds the file. A writer migrates the schema and refreshes
the named views on open; a reader of an older file upgrades it once.

Opening costs ~25 ms whatever the file (DuckDB builds its catalog of built-in functions
for every database it opens), so a sequence of short units of work — a round's bookkeeping
is a dozen — runs inside ``held``: the file is opened once, and each unit takes a cursor
of that connection instead.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import duckdb

from warehouse.schema import SCHEMA_VERSION, SchemaError, check_schema, migrate
from warehouse.views import ensure_views, stale_views

if TYPE_CHECKING:  # imported where frames are made: `keynes sql` reads this module without polars
    import polars as pl

#: The oldest DuckDB release that must read a new warehouse file (the stock CLI on PyPI).
STORAGE_COMPATIBILITY = "v1.4.0"

_LOCK_MARKERS = ("Could not set lock", "Conflicting lock", "database is locked", "being used by another process")


class WarehouseError(RuntimeError):
    """The warehouse file cannot be used (missing directory, locked, not writable…)."""


class DiskFullError(WarehouseError):
    """The warehouse's file system is full: retrying cannot help, freeing space and rerunning does."""


#: How DuckDB reports a full file system (it names the file it could not write).
_DISK_FULL = "No space left on device"

#: The files ``WarehouseFile.held`` keeps open in this process: path → connection. Per process, not
#: per handle: the flow, a stage and the report make their own handles on one file, and a block held
#: through one of them (the report stage's) serves all of them on one connection.
_HELD: dict[str, duckdb.DuckDBPyConnection] = {}
_HELD_LOCK = threading.Lock()


def disk_full(path: Path, error: BaseException) -> DiskFullError | None:
    """``error`` as a one-line ``DiskFullError`` naming the file and the free space, if it is one."""
    if _DISK_FULL not in str(error) and getattr(error, "errno", None) != errno.ENOSPC:
        return None
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:,.1f} MiB free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"{path}: no space left on its file system ({free}); free some space and rerun the same "
                         "command: it resumes without losing or repeating a row")


class WarehouseFile:
    """A keynes DuckDB file: connections for units of work (the repository is ``Warehouse``).

    Args:
        path: the database file; its directory must exist.
        lock_timeout_s: how long to wait for another process that holds the file
            (default: ``KEYNES_LOCK_TIMEOUT_S`` or 60 s).
    """

    def __init__(self, path: str | Path, lock_timeout_s: float | None = None):
        self.path = Path(path)
        # KEYNES_LOCK_TIMEOUT_S sets the default (tests and impatient users shorten it).
        self.lock_timeout_s = float(os.environ.get("KEYNES_LOCK_TIMEOUT_S", 60)) if lock_timeout_s is None else lock_timeout_s

    # ------------------------------------------------------------------ connections
    @contextmanager
    def held(self) -> Iterator[None]:
        """Keep the file open for writing while the block runs: every unit of work inside
        (``connect``, ``transaction``, ``query``, from any thread of this process, through any
        ``WarehouseFile`` of the same path) takes a cursor of one connection, migrated once,
        instead of opening the file. Other processes (``keynes sql``, reports) wait while the
        file is held, so hold it around bookkeeping, not around play. Nests: the outermost
        block opens and closes."""
        key = os.path.abspath(self.path)
        with _HELD_LOCK:
            outermost = key not in _HELD
        if not outermost:  # an enclosing block holds the file
            yield
            return
        with self.connect() as con:
            with _HELD_LOCK:
                _HELD[key] = con
            try:
                yield
            finally:
                with _HELD_LOCK:
                    del _HELD[key]

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for one unit of work; writers get the schema migrated first (inside
        ``held``: a cursor of the held connection)."""
        with _HELD_LOCK:
            held = _HELD.get(os.path.abspath(self.path))
            cursor = held.cursor() if held is not None else None
        if cursor is not None:
            try:
                yield cursor
            finally:
                cursor.close()
            return
        if read_only and not self.path.exists():
            raise WarehouseError(f"{self.path}: no such warehouse (run an experiment first)")
        if not read_only and not self.path.parent.is_dir():
            raise WarehouseError(f"{self.path}: directory {str(self.path.parent)!r} does not exist")
        con = self._open(read_only, deadline=time.monotonic() + self.lock_timeout_s)
        try:
            if not read_only:
                try:
                    migrate(con)
                except SchemaError as exc:
                    raise WarehouseError(f"{self.path}: {exc}") from None
                ensure_views(con)
            elif _needs_upgrade(con, self.path):
                # An older file (or one without the current views): upgrade it once through
                # a short write connection, then read.
                con.close()
                with self.connect():
                    pass
                con = self._open(read_only=True, deadline=time.monotonic() + self.lock_timeout_s)
            yield con
        finally:
            con.close()

    def check_writable(self) -> None:
        """Fail early, writing nothing, when a run could not write this warehouse: a missing
        or unwritable directory, a file held by another writer (after the lock timeout), a
        file that is not a keynes warehouse or is newer than this keynes.

        Raises:
            WarehouseError: one line naming the file and the problem.
        """
        parent = self.path.parent
        if not parent.is_dir():
            raise WarehouseError(f"{self.path}: directory {str(parent)!r} does not exist")
        try:  # os.access() says yes to root even on read-only file systems: really try
            with tempfile.TemporaryFile(dir=parent):
                pass
        except OSError as exc:
            raise WarehouseError(f"{self.path}: directory {str(parent)!r} is not writable ({exc.strerror})") from None
        if self.path.is_dir():
            raise WarehouseError(f"{self.path}: is a directory, not a warehouse file")
        if self.path.exists():
            con = self._open(read_only=False)
            try:
                check_schema(con)
            except SchemaError as exc:
                raise WarehouseError(f"{self.path}: {exc}") from None
            finally:
                con.close()

    def _open(self, read_only: bool, deadline: float | None = None) -> duckdb.DuckDBPyConnection:
        """Open the file, retrying while another process holds it (until ``deadline``,
        by default the lock timeout from now)."""
        if deadline is None:
            deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.02
        while True:
            try:
                # New files are written in a storage format DuckDB 1.4+ reads, so the stock
                # `duckdb` CLI opens them too; existing files keep the format they have.
                config = {} if self.path.exists() else {"storage_compatibility_version": STORAGE_COMPATIBILITY}
                return duckdb.connect(str(self.path), read_only=read_only, config=config)
            except duckdb.IOException as exc:
                message = str(exc)
                if any(m in message for m in _LOCK_MARKERS) and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.5)
                    continue
                if any(m in message for m in _LOCK_MARKERS):
                    raise WarehouseError(f"{self.path}: held by another process for over {self.lock_timeout_s:g} s") from exc
                raise WarehouseError(f"{self.path}: {message.splitlines()[0]}") from exc

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A write connection inside one transaction (rolled back on error; a full file system
        raises ``DiskFullError``)."""
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException as exc:
                try:
                    con.execute("ROLLBACK")
                except duckdb.TransactionException:
                    pass  # a failed COMMIT has ended the transaction already
                full = disk_full(self.path, exc)
                if full is not None:
                    raise full from exc
                raise

    def query(self, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
        """Run a read-only query and return a polars frame."""
        with self.connect(read_only=True) as con:
            return frame_of(con, sql, params)


def _needs_upgrade(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """True when a read-only connection sees an older schema or missing/outdated views.

    Raises:
        WarehouseError: the file is not a keynes warehouse, is empty, or is newer than this keynes.
    """
    try:
        version = check_schema(con)
    except SchemaError as exc:
        raise WarehouseError(f"{path}: {exc}") from None
    if version == 0:
        raise WarehouseError(f"{path}: an empty database, not a keynes warehouse (run an experiment first)")
    return version < SCHEMA_VERSION or bool(stale_views(con))


def frame_of(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | dict[str, Any] | None = None) -> pl.DataFrame:
    """Run a query and return a polars frame (through Arrow, without a copy); a statement without
    a result (``SET``, ``CHECKPOINT``) gives an empty frame."""
    import polars as pl

    relation = con.sql(query, params=params or None)
    return pl.DataFrame() if relation is None else pl.from_arrow(relation.to_arrow_table())
