"""The warehouse repository: every read and write of keynes' facts, Arrow in and out.

One transaction per fact group; every write is keyed, so writing the same shard or
round twice changes nothing. Connections and migrations live in ``warehouse.files``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl

from core.game import HISTORY_FIELDS
from warehouse.files import WarehouseError, WarehouseFile, frame_of
from warehouse.views import ensure_views

__all__ = ["RunRow", "ShardRecord", "Warehouse", "WarehouseError"]

# The row models (warehouse.validation) are imported where rows are validated, not with this
# module: pandera brings pandas (~0.6 s), and `keynes run` checks its warehouse before its first line.


@dataclass(frozen=True)
class RunRow:
    """A ``runs`` row: one arm of an experiment, as ``begin_run`` records it (the table's columns,
    in its order; ``spec``, ``prompting`` and ``sampling`` are stored as JSON)."""

    run_id: str
    experiment_id: str
    arm: int
    engine: str
    model: str
    prompt_mode: str
    temperature: float
    ratio: str
    ratio_value: float
    offset: float
    low: float
    high: float
    answers: str
    tolerance: float
    rounds: int
    equilibrium: float | None
    spec: dict[str, Any]
    prompting: dict[str, Any] | None = None
    sampling: dict[str, Any] | None = None
    status: str = "running"


@dataclass(frozen=True)
class ShardRecord:
    """A finished shard as ``write_shards`` commits it: its guesses, its ``shards`` row (where and
    how fast it was played) and, with shared-context answers, its ``answer_distributions`` rows."""

    guesses: pl.DataFrame
    run_id: str
    round: int
    shard: int
    n: int
    node: str
    worker: str
    seconds: float
    limit_wait_s: float = 0.0
    tokens_evaluated: int | None = None
    tokens_bound: int | None = None
    distributions: pl.DataFrame | None = None


class Warehouse(WarehouseFile):
    """A keynes DuckDB file and the queries keynes writes and reads it with.

    Args:
        path: the database file; its directory must exist.
        lock_timeout_s: how long to wait for another process that holds the file
            (default: ``KEYNES_LOCK_TIMEOUT_S`` or 60 s).
    """

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

    def recorded_shard_size(self, experiment_id: str, read_only: bool = False) -> int | None:
        """The ``workers.shard_size`` an experiment's first run recorded with its config (None:
        no such experiment, or none recorded)."""
        if not self.path.exists():
            return None
        with self.connect(read_only=read_only) as con:
            rows = con.execute(
                "SELECT TRY_CAST(json_extract(config, '$.workers.shard_size') AS BIGINT) FROM experiments WHERE experiment_id = ?",
                [experiment_id],
            ).fetchall()
        return int(rows[0][0]) if rows and rows[0][0] else None

    def finish_experiment(self, experiment_id: str, status: str = "completed") -> None:
        with self.transaction() as con:
            con.execute(
                "UPDATE experiments SET status = ?, finished_at = now() WHERE experiment_id = ?", [status, experiment_id]
            )

    def begin_run(self, run: RunRow) -> None:
        """Record a run (one arm of an experiment) once; a rerun marks it running again."""
        values = asdict(run)
        quoted = ", ".join(f'"{f.name}"' for f in fields(run))
        with self.transaction() as con:
            con.execute(
                f"INSERT INTO runs ({quoted}) VALUES ({', '.join('?' * len(values))}) "
                "ON CONFLICT (run_id) DO UPDATE SET status = 'running', finished_at = NULL",
                [json.dumps(v) if isinstance(v, dict) else v for v in values.values()],
            )

    def finish_run(self, run_id: str, status: str = "completed") -> None:
        with self.transaction() as con:
            con.execute("UPDATE runs SET status = ?, finished_at = now() WHERE run_id = ?", [status, run_id])

    def interrupt(self, experiment_id: str) -> None:
        """Mark an experiment and those of its runs still ``running`` as ``interrupted``."""
        with self.transaction() as con:
            for table in ("runs", "experiments"):
                con.execute(f"UPDATE {table} SET status = 'interrupted', finished_at = now() "
                            "WHERE experiment_id = ? AND status = 'running'", [experiment_id])

    def experiment_created_at(self, experiment_id: str) -> datetime | None:
        """When an experiment was first recorded (None when it is not, or the file is missing)."""
        if not self.path.exists():
            return None
        rows = self.query("SELECT created_at FROM experiments WHERE experiment_id = ?", [experiment_id])
        return rows.item(0, 0) if rows.height else None

    def statuses(self, experiment_id: str) -> set[str]:
        """The statuses of an experiment and of its runs (empty when it is not recorded)."""
        rows = self.query(
            "SELECT status FROM runs WHERE experiment_id = ? UNION ALL SELECT status FROM experiments WHERE experiment_id = ?",
            [experiment_id, experiment_id],
        )
        return set(rows["status"].to_list())

    def round_summary(self, experiment_id: str) -> pl.DataFrame:
        """The ``round_summary`` view of one experiment, by arm and round."""
        return self.query("SELECT * FROM round_summary WHERE experiment_id = ? ORDER BY arm, round", [experiment_id])

    def worker_summary(self, experiment_id: str, since: datetime) -> pl.DataFrame:
        """The workers that committed shards of an experiment since ``since``: node, worker,
        engine (its model), shards, agents, busy seconds and agents/s while busy."""
        return self.query(
            """SELECT s.node, s.worker, r.model AS engine, count(*) AS shards, sum(s.n) AS agents,
                      sum(s.seconds) AS busy_s, sum(s.n) / nullif(sum(s.seconds), 0) AS agents_per_s
               FROM shards s JOIN runs r USING (run_id)
               WHERE r.experiment_id = ? AND s.committed_at >= ?
               GROUP BY ALL ORDER BY s.node, s.worker""",
            [experiment_id, since],
        )

    # ------------------------------------------------------------------ personas
    def write_personas(self, experiment_id: str, personas: pl.DataFrame) -> int:
        """Store an experiment's personas once (new demographic columns are added to
        the table); returns the rows written (0 when they were already there)."""
        frame = personas.with_columns(experiment_id=pl.lit(experiment_id))
        if "background" not in frame.columns:
            frame = frame.with_columns(background=pl.lit(None, pl.String))
        from warehouse.validation import PersonaRows

        frame = PersonaRows.validate(frame, lazy=True)
        with self.transaction() as con:
            existing = con.execute("SELECT count(*) FROM personas WHERE experiment_id = ?", [experiment_id]).fetchall()[0][0]
            if existing:
                return 0
            have = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'personas'").fetchall()}
            arrow = frame.to_arrow()
            added = [column for column in frame.columns if column not in have]
            for column in added:
                sql_type = _sql_type(frame.schema[column])
                con.execute(f'ALTER TABLE personas ADD COLUMN "{column}" {sql_type}')
            if added:  # the persona views list the columns (a connection held open would keep the old ones)
                ensure_views(con)
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
            frame = frame_of(
                con,
                "SELECT * EXCLUDE (experiment_id) FROM personas WHERE experiment_id = ? ORDER BY agent_id", [experiment_id]
            )
        return frame.select([c for c in frame.columns if frame[c].null_count() < frame.height or c in ("agent_id", "background")])

    # ------------------------------------------------------------------ guesses, shards, rounds
    def committed_agents(self, run_id: str, round_: int) -> np.ndarray:
        """Agent ids whose guesses of this round are already stored."""
        with self.connect() as con:
            sql = "SELECT agent_id FROM guesses WHERE run_id = ? AND round = ?"
            return frame_of(con, sql, [run_id, round_])["agent_id"].to_numpy()

    def write_shards(self, shards: list[ShardRecord]) -> int:
        """Commit shards of one round — their guesses and ``shards`` rows — in one transaction.

        Rows already stored for (run, round, agent) are skipped, so a re-dispatched
        shard never duplicates a guess. Returns the number of new rows.

        One transaction for every shard that is ready (not one per shard) matters at scale:
        a DuckDB commit costs ~0.1 s whatever its size, a million rows ~0.6 s in all.
        """
        if not shards:
            return 0
        from warehouse.validation import GuessRows

        columns = list(GuessRows.to_schema().columns)  # the guesses table's, in its order
        # Guesses from per-agent engines may leave out the shared-context columns: not shared.
        defaults = {"shared_prompt": pl.lit(False), "context": pl.lit(None, pl.String)}
        frame = pl.concat(
            [s.guesses.with_columns(**{c: v for c, v in defaults.items() if c not in s.guesses.columns}).select(columns)
             for s in shards],
            how="vertical_relaxed",
        )
        frame = GuessRows.validate(frame, lazy=True)
        keys = {(s.run_id, s.round) for s in shards}
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
                f"""INSERT INTO guesses SELECT {', '.join(columns)} FROM new_guesses n
                    WHERE NOT EXISTS (SELECT 1 FROM guesses g WHERE g.run_id = ? AND g.round = ?
                                      AND g.agent_id BETWEEN ? AND ? AND g.agent_id = n.agent_id)""",
                [run_id, round_, low, high],
            ).fetchall()[0][0]
            con.unregister("new_guesses")
            con.executemany(
                """INSERT INTO shards (run_id, round, shard, n, node, worker, seconds, limit_wait_s, tokens_evaluated, tokens_bound)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING""",
                [[s.run_id, s.round, s.shard, s.n, s.node, s.worker, s.seconds, s.limit_wait_s, s.tokens_evaluated, s.tokens_bound]
                 for s in shards],
            )
            dists = [s.distributions for s in shards if s.distributions is not None]
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
            return frame_of(
                con,
                "SELECT agent_id, guess, valid FROM guesses WHERE run_id = ? AND round = ? ORDER BY agent_id", [run_id, round_]
            )

    def finished_rounds(self, run_ids: list[str], read_only: bool = False) -> dict[str, set[int]]:
        """Rounds whose outcome is committed, per run (empty when the file does not exist yet)."""
        if not self.path.exists():
            return {}
        with self.connect(read_only=read_only) as con:
            frame = frame_of(con, "SELECT run_id, round FROM rounds WHERE list_contains(?, run_id)", [list(run_ids)])
        out: dict[str, set[int]] = {}
        for run_id, round_ in frame.iter_rows():
            out.setdefault(run_id, set()).add(round_)
        return out

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

    def history(self, run_id: str, before_round: int) -> list[dict[str, Any]]:
        """Outcomes of the rounds before ``before_round``, oldest first."""
        return self._outcomes("rounds", run_id, before_round).to_dicts()

    def group_history(self, run_id: str, before_round: int) -> dict[str, list[dict[str, Any]]]:
        """Each group's outcomes of the rounds before ``before_round``, oldest first."""
        history: dict[str, list[dict[str, Any]]] = {}
        for row in self._outcomes("group_rounds", run_id, before_round).to_dicts():
            history.setdefault(row.pop("group_name"), []).append(row)
        return history

    def _outcomes(self, table: str, run_id: str, before_round: int) -> pl.DataFrame:
        """The rows of ``rounds`` or ``group_rounds`` (then by group) before ``before_round``."""
        group = "group_name, " if table == "group_rounds" else ""
        with self.connect() as con:
            return frame_of(
                con,
                f"SELECT {group}{', '.join(HISTORY_FIELDS)} FROM {table} "
                f"WHERE run_id = ? AND round < ? ORDER BY {group}round",
                [run_id, before_round],
            )

    def own_guesses(self, run_id: str, before_round: int) -> pl.DataFrame:
        """Each agent's guesses in earlier rounds: agent_id, own_guesses (list, oldest first)."""
        with self.connect() as con:
            return frame_of(
                con,
                "SELECT agent_id, list(guess ORDER BY round) AS own_guesses FROM guesses "
                "WHERE run_id = ? AND round < ? GROUP BY agent_id",
                [run_id, before_round],
            )


def _sql_type(dtype: pl.DataType) -> str:
    if dtype.is_integer():
        return "BIGINT"
    if dtype.is_float():
        return "DOUBLE"
    if dtype == pl.Boolean:
        return "BOOLEAN"
    return "VARCHAR"
