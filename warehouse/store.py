"""Reading and writing the warehouse: Arrow in, one transaction per fact group.

The writer opens the DuckDB file only for the length of a commit, so readers
(``keynes sql``, reports) can open it read-only between commits; both sides retry
briefly when the other holds the file. Every write is keyed: writing the same shard
or round twice changes nothing.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import duckdb
import numpy as np
import polars as pl

from warehouse.schema import SCHEMA_VERSION, SchemaError, check_schema, migrate
from warehouse.validation import Guesses, Personas
from warehouse.views import ensure_views, stale_views

#: Column order of the guesses table.
GUESS_COLUMNS = list(Guesses.to_schema().columns)

#: The oldest DuckDB release that must read a new warehouse file (the stock CLI on PyPI).
STORAGE_COMPATIBILITY = "v1.4.0"

_LOCK_MARKERS = ("Could not set lock", "Conflicting lock", "database is locked", "being used by another process")


class WarehouseError(RuntimeError):
    """The warehouse file cannot be used (missing directory, locked, not writable…)."""


class Warehouse:
    """A keynes DuckDB file.

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
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection for one unit of work; writers get the schema migrated first."""
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
        """A write connection inside one transaction (rolled back on error)."""
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def query(self, sql: str, params: list[Any] | None = None) -> pl.DataFrame:
        """Run a read-only query and return a polars frame."""
        with self.connect(read_only=True) as con:
            return _frame(con, sql, params)

    # ------------------------------------------------------------------ experiments and runs
    def begin_experiment(self, experiment_id: str, name: str, config: dict, config_hash: str, seed: int, population: int) -> None:
        """Record an experiment (once); a rerun marks it running again."""
        with self.transaction() as con:
            con.execute(
                """INSERT INTO experiments (experiment_id, name, config, config_hash, seed, population, status)
                   VALUES (?, ?, ?, ?, ?, ?, 'running')
                   ON CONFLICT (experiment_id) DO UPDATE SET status = 'running', finished_at = NULL""",
                [experiment_id, name, json.dumps(config), config_hash, seed, population],
            )

    def finish_experiment(self, experiment_id: str, status: str = "completed") -> None:
        with self.transaction() as con:
            con.execute(
                "UPDATE experiments SET status = ?, finished_at = now() WHERE experiment_id = ?", [status, experiment_id]
            )

    def begin_run(self, run: dict[str, Any]) -> None:
        """Record a run (one arm of an experiment) once; a rerun marks it running again."""
        columns = list(run)
        quoted = ", ".join(f'"{c}"' for c in columns)
        with self.transaction() as con:
            con.execute(
                f"INSERT INTO runs ({quoted}) VALUES ({', '.join('?' * len(columns))}) "
                "ON CONFLICT (run_id) DO UPDATE SET status = 'running', finished_at = NULL",
                [json.dumps(v) if isinstance(v, dict) else v for v in run.values()],
            )

    def finish_run(self, run_id: str, status: str = "completed") -> None:
        with self.transaction() as con:
            con.execute("UPDATE runs SET status = ?, finished_at = now() WHERE run_id = ?", [status, run_id])

    # ------------------------------------------------------------------ personas
    def write_personas(self, experiment_id: str, personas: pl.DataFrame) -> int:
        """Store an experiment's personas once (new demographic columns are added to
        the table); returns the rows written (0 when they were already there)."""
        frame = personas.with_columns(experiment_id=pl.lit(experiment_id))
        if "background" not in frame.columns:
            frame = frame.with_columns(background=pl.lit(None, pl.String))
        frame = Personas.validate(frame, lazy=True)
        with self.transaction() as con:
            existing = con.execute("SELECT count(*) FROM personas WHERE experiment_id = ?", [experiment_id]).fetchall()[0][0]
            if existing:
                return 0
            have = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'personas'").fetchall()}
            arrow = frame.to_arrow()
            for column in frame.columns:
                if column not in have:
                    sql_type = _sql_type(frame.schema[column])
                    con.execute(f'ALTER TABLE personas ADD COLUMN "{column}" {sql_type}')
            con.register("new_personas", arrow)
            quoted = ", ".join(f'"{c}"' for c in frame.columns)
            con.execute(f"INSERT INTO personas ({quoted}) SELECT {quoted} FROM new_personas")
            con.unregister("new_personas")
            return frame.height

    def count_personas(self, experiment_id: str) -> int:
        """How many personas of this experiment are stored (0 for a new file)."""
        if not self.path.exists():
            return 0
        with self.connect() as con:
            return con.execute("SELECT count(*) FROM personas WHERE experiment_id = ?", [experiment_id]).fetchall()[0][0]

    def read_personas(self, experiment_id: str) -> pl.DataFrame:
        """An experiment's personas, ordered by agent id, without the experiment column."""
        with self.connect() as con:
            frame = _frame(
                con,
                "SELECT * EXCLUDE (experiment_id) FROM personas WHERE experiment_id = ? ORDER BY agent_id", [experiment_id]
            )
        return frame.select([c for c in frame.columns if frame[c].null_count() < frame.height or c in ("agent_id", "background")])

    # ------------------------------------------------------------------ guesses, shards, rounds
    def committed_agents(self, run_id: str, round_: int) -> np.ndarray:
        """Agent ids whose guesses of this round are already stored."""
        with self.connect() as con:
            sql = "SELECT agent_id FROM guesses WHERE run_id = ? AND round = ?"
            return _frame(con, sql, [run_id, round_])["agent_id"].to_numpy()

    def write_shard(self, guesses: pl.DataFrame, shard: dict[str, Any]) -> int:
        """Commit one shard's guesses and its ``shards`` row (see ``write_shards``)."""
        return self.write_shards([(guesses, shard)])

    def write_shards(self, shards: list[tuple[pl.DataFrame, dict[str, Any]]]) -> int:
        """Commit shards of one round — their guesses and ``shards`` rows — in one transaction.

        Rows already stored for (run, round, agent) are skipped, so a re-dispatched
        shard never duplicates a guess. Returns the number of new rows.

        One transaction for every shard that is ready (not one per shard) matters at scale:
        a DuckDB commit costs ~0.1 s whatever its size, a million rows ~0.6 s in all.
        """
        if not shards:
            return 0
        frame = pl.concat([g.select(GUESS_COLUMNS) for g, _ in shards], how="vertical_relaxed")
        frame = Guesses.validate(frame, lazy=True)
        keys = {(s["run_id"], s["round"]) for _, s in shards}
        (run_id, round_) = min(keys)
        if len(keys) > 1 or frame.filter((pl.col("run_id") != run_id) | (pl.col("round") != round_)).height:
            raise ValueError(f"write_shards: one call commits shards of one run and round, got {sorted(keys)}")
        # Bounding the anti-join's probe of stored guesses by run, round and the agents'
        # id range lets DuckDB skip every other row group (zone maps): a commit costs the
        # size of its shards, not of the table. INSERT returns its row count.
        ids = frame["agent_id"]
        low, high = (int(ids.min()), int(ids.max())) if frame.height else (0, -1)
        with self.transaction() as con:
            con.register("new_guesses", frame.to_arrow())
            inserted = con.execute(
                f"""INSERT INTO guesses SELECT {', '.join(GUESS_COLUMNS)} FROM new_guesses n
                    WHERE NOT EXISTS (SELECT 1 FROM guesses g WHERE g.run_id = ? AND g.round = ?
                                      AND g.agent_id BETWEEN ? AND ? AND g.agent_id = n.agent_id)""",
                [run_id, round_, low, high],
            ).fetchall()[0][0]
            con.unregister("new_guesses")
            con.executemany(
                """INSERT INTO shards (run_id, round, shard, n, node, worker, seconds) VALUES (?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT DO NOTHING""",
                [[s["run_id"], s["round"], s["shard"], s["n"], s["node"], s["worker"], s["seconds"]] for _, s in shards],
            )
            dists = [s["distributions"] for _, s in shards if s.get("distributions") is not None]
            if dists:  # shared-context answers: their exact distributions, with the guesses they drew
                con.register("new_distributions", pl.concat(dists, how="vertical_relaxed").to_arrow())
                con.execute(
                    """INSERT INTO answer_distributions SELECT run_id, round, shard, context, answer, probability, agents
                       FROM new_distributions ON CONFLICT DO NOTHING"""
                )
                con.unregister("new_distributions")
        return inserted

    def round_guesses(self, run_id: str, round_: int) -> pl.DataFrame:
        """The stored guesses of one round: agent_id, guess, valid."""
        with self.connect() as con:
            return _frame(
                con,
                "SELECT agent_id, guess, valid FROM guesses WHERE run_id = ? AND round = ? ORDER BY agent_id", [run_id, round_]
            )

    def finished_rounds(self, run_id: str) -> list[int]:
        """Rounds whose outcome is committed."""
        with self.connect() as con:
            return [r[0] for r in con.execute("SELECT round FROM rounds WHERE run_id = ? ORDER BY round", [run_id]).fetchall()]

    def write_outcome(self, run_id: str, round_: int, outcome: Any, seconds: float, groups: dict[str, Any] | None = None) -> bool:
        """Commit a round's outcome and winners in one transaction; False if already stored.

        ``groups`` (group name → outcome) are committed in the same transaction to
        ``group_rounds`` and ``group_winners``.
        """
        with self.transaction() as con:
            if con.execute("SELECT count(*) FROM rounds WHERE run_id = ? AND round = ?", [run_id, round_]).fetchall()[0][0]:
                return False
            con.execute(
                "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [run_id, round_, outcome.n, outcome.n_valid, outcome.mean, outcome.median, outcome.std,
                 outcome.target, outcome.winning_guess, outcome.n_winners, seconds],
            )
            winners = pl.DataFrame({"run_id": run_id, "round": round_, "agent_id": outcome.winners}).with_columns(
                pl.col("round").cast(pl.Int32), pl.col("agent_id").cast(pl.Int64)
            )
            con.register("new_winners", winners.to_arrow())
            con.execute("INSERT INTO winners SELECT run_id, round, agent_id FROM new_winners")
            con.unregister("new_winners")
            for name, result in (groups or {}).items():
                con.execute(
                    "INSERT INTO group_rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [run_id, round_, name, result.n, result.n_valid, result.mean, result.median, result.std,
                     result.target, result.winning_guess, result.n_winners],
                )
                members = pl.DataFrame({"agent_id": result.winners}).with_columns(pl.col("agent_id").cast(pl.Int64))
                con.register("new_group_winners", members.to_arrow())
                con.execute("INSERT INTO group_winners SELECT ?, ?, ?, agent_id FROM new_group_winners", [run_id, round_, name])
                con.unregister("new_group_winners")
        return True

    def write_groups(self, experiment_id: str, groups: pl.DataFrame) -> int:
        """Store which group every agent plays in (columns agent_id, group), once."""
        frame = groups.select(pl.lit(experiment_id).alias("experiment_id"), pl.col("agent_id").cast(pl.Int64), pl.col("group").alias("group_name"))
        with self.transaction() as con:
            if con.execute("SELECT count(*) FROM group_members WHERE experiment_id = ?", [experiment_id]).fetchall()[0][0]:
                return 0
            con.register("new_members", frame.to_arrow())
            con.execute("INSERT INTO group_members SELECT experiment_id, agent_id, group_name FROM new_members")
            con.unregister("new_members")
        return frame.height

    def group_history(self, run_id: str, before_round: int) -> dict[str, list[dict[str, Any]]]:
        """Each group's outcomes of the rounds before ``before_round``, oldest first."""
        with self.connect() as con:
            frame = _frame(
                con,
                "SELECT group_name, round, n, n_valid, mean, median, target, winning_guess, n_winners FROM group_rounds "
                "WHERE run_id = ? AND round < ? ORDER BY group_name, round",
                [run_id, before_round],
            )
        history: dict[str, list[dict[str, Any]]] = {}
        for row in frame.to_dicts():
            history.setdefault(row.pop("group_name"), []).append(row)
        return history

    def history(self, run_id: str, before_round: int) -> list[dict[str, Any]]:
        """Outcomes of the rounds before ``before_round``, oldest first."""
        with self.connect() as con:
            frame = _frame(
                con,
                "SELECT round, n, n_valid, mean, median, target, winning_guess, n_winners FROM rounds "
                "WHERE run_id = ? AND round < ? ORDER BY round",
                [run_id, before_round],
            )
        return frame.to_dicts()

    def own_guesses(self, run_id: str, before_round: int) -> pl.DataFrame:
        """Each agent's guesses in earlier rounds: agent_id, own_guesses (list, oldest first)."""
        with self.connect() as con:
            return _frame(
                con,
                "SELECT agent_id, list(guess ORDER BY round) AS own_guesses FROM guesses "
                "WHERE run_id = ? AND round < ? GROUP BY agent_id",
                [run_id, before_round],
            )


def _needs_upgrade(con: duckdb.DuckDBPyConnection, path: Path) -> bool:
    """True when a read-only connection sees an older schema or missing/outdated views.

    Raises:
        WarehouseError: the file is not a keynes warehouse, or is newer than this keynes.
    """
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()}
    if "schema_version" not in tables:
        if tables:
            raise WarehouseError(f"{path}: not a keynes warehouse (tables {sorted(tables)[:5]}, no schema_version)")
        raise WarehouseError(f"{path}: an empty database, not a keynes warehouse (run an experiment first)")
    version = con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] or 0
    if version > SCHEMA_VERSION:
        raise WarehouseError(
            f"{path}: the warehouse has schema version {version}, newer than this keynes ({SCHEMA_VERSION}); upgrade keynes"
        )
    return version < SCHEMA_VERSION or bool(stale_views(con))


def _sql_type(dtype: pl.DataType) -> str:
    if dtype.is_integer():
        return "BIGINT"
    if dtype.is_float():
        return "DOUBLE"
    if dtype == pl.Boolean:
        return "BOOLEAN"
    return "VARCHAR"


def _frame(con: duckdb.DuckDBPyConnection, query: str, params: list[Any] | None = None) -> pl.DataFrame:
    """Run a query and return a polars frame (through Arrow, without a copy)."""
    return pl.from_arrow(con.sql(query, params=params or None).to_arrow_table())
