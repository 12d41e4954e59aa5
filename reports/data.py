"""Load: the report's data store — one query per figure, all of them over the warehouse views.

Nothing here computes statistics: the views in ``warehouse.views`` do, so a number in a
report is the number a user gets from ``keynes sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import polars as pl

from warehouse.store import Warehouse


class ExperimentNotFound(LookupError):
    """No experiment of that name or id in the warehouse."""


def list_experiments(warehouse: Warehouse) -> pl.DataFrame:
    """Every experiment in the warehouse, newest first (the ``experiment_overview`` view)."""
    return warehouse.query("SELECT * FROM experiment_overview ORDER BY created_at DESC")


def experiment_ids(warehouse: Warehouse, experiment: str | None = None) -> list[str]:
    """Experiment ids to report on.

    Args:
        warehouse: the warehouse.
        experiment: an experiment id, or a name (its newest experiment); None means all.

    Raises:
        ExperimentNotFound: nothing matches (the message lists what exists).
    """
    experiments = list_experiments(warehouse)
    if experiment is None:
        if experiments.is_empty():
            raise ExperimentNotFound("the warehouse holds no experiment yet (run one first)")
        return experiments["experiment_id"].to_list()
    exact = experiments.filter(pl.col("experiment_id") == experiment)
    if exact.height:
        return [experiment]
    named = experiments.filter(pl.col("name") == experiment)
    if named.height:
        return [named["experiment_id"][0]]  # newest first
    known = ", ".join(sorted(set(experiments["name"].to_list()))) or "none"
    raise ExperimentNotFound(f"experiment {experiment!r} not found; available: {known}")


@dataclass
class ReportData:
    """The numbers behind one experiment's page, each frame read once from a view."""

    warehouse: Warehouse
    experiment_id: str

    def _view(self, view: str, order: str = "", where: str = "") -> pl.DataFrame:
        sql = f"SELECT * FROM {view} WHERE experiment_id = ? {where} {('ORDER BY ' + order) if order else ''}"
        return self.warehouse.query(sql, [self.experiment_id])

    @cached_property
    def overview(self) -> dict[str, Any]:
        frame = self._view("experiment_overview")
        if frame.is_empty():
            raise ExperimentNotFound(f"experiment {self.experiment_id!r} not found")
        return frame.row(0, named=True)

    @cached_property
    def arms(self) -> pl.DataFrame:
        return self._view("arms", "arm")

    @cached_property
    def rounds(self) -> pl.DataFrame:
        return self._view("round_summary", "arm, round")

    @cached_property
    def convergence(self) -> pl.DataFrame:
        return self._view("convergence", "arm, round")

    @cached_property
    def histogram(self) -> pl.DataFrame:
        return self._view("guess_histogram", "arm, round, bin_low")

    @cached_property
    def by_prompt_mode(self) -> pl.DataFrame:
        return self._view("guess_stats_by_prompt_mode", "prompt_mode, round")

    @cached_property
    def by_model(self) -> pl.DataFrame:
        return self._view("guess_stats_by_model", "model, round")

    @cached_property
    def by_rule(self) -> pl.DataFrame:
        return self._view("guess_stats_by_rule", "rule, round")

    @cached_property
    def by_attribute(self) -> pl.DataFrame:
        return self._view("guess_stats_by_attribute", "attribute, value, arm, round")

    @cached_property
    def composition(self) -> pl.DataFrame:
        return self._view("population_composition", "attribute, value")

    @cached_property
    def invalid(self) -> pl.DataFrame:
        return self._view("invalid_answers", "arm, round")

    @cached_property
    def invalid_reasons(self) -> pl.DataFrame:
        return self._view("invalid_reasons", "arm, n DESC")

    @cached_property
    def usage(self) -> pl.DataFrame:
        return self._view("usage_by_arm", "arm")

    @cached_property
    def references(self) -> pl.DataFrame:
        """Human reference results whose rule matches an arm's: arm, source, round, mean, median."""
        return self.warehouse.query(
            """SELECT a.arm, h.source, h.round, h.mean, h.median
               FROM arms a JOIN human_reference h
                 ON h.ratio = a.ratio AND h."offset" = a."offset" AND h.low = a.low AND h.high = a.high
               WHERE a.experiment_id = ? ORDER BY a.arm, h.round""",
            [self.experiment_id],
        )

    def arm_label(self, arm: int) -> str:
        """A short label: "arm 0 · basic · simulated/uniform"."""
        row = self.arms.filter(pl.col("arm") == arm).row(0, named=True)
        return f"arm {arm} · {row['prompt_mode']} · {row['model']}"


def experiment_index(warehouse: Warehouse) -> pl.DataFrame:
    """One row per experiment for the report server's index: status, agents, arms, rounds
    played and planned, guesses stored (from the ``shards`` rows: cheap at any size), last update."""
    return warehouse.query(
        """WITH s AS (SELECT r.experiment_id, sum(s.n)::BIGINT AS guesses, max(s.committed_at) AS last_shard
                      FROM shards s JOIN runs r USING (run_id) GROUP BY ALL),
                a AS (SELECT experiment_id, count(*) AS arms, sum(rounds)::BIGINT AS rounds_planned FROM runs GROUP BY ALL),
                d AS (SELECT r.experiment_id, count(*) AS rounds_played FROM rounds d JOIN runs r USING (run_id) GROUP BY ALL)
           SELECT e.experiment_id, e.name, e.status, e.population, coalesce(a.arms, 0) AS arms,
                  coalesce(d.rounds_played, 0) AS rounds_played, coalesce(a.rounds_planned, 0) AS rounds_planned,
                  coalesce(s.guesses, 0) AS guesses, greatest(e.created_at, e.finished_at, s.last_shard) AS updated_at
           FROM experiments e LEFT JOIN s USING (experiment_id) LEFT JOIN a USING (experiment_id)
                LEFT JOIN d USING (experiment_id)"""
    )


def experiment_version(warehouse: Warehouse, experiment_id: str) -> tuple | None:
    """What changes whenever something of an experiment is written (None: no such experiment):
    its status, its runs' statuses, rounds and shards committed, the newest shard."""
    frame = warehouse.query(
        """SELECT e.status,
                  (SELECT string_agg(status, ',' ORDER BY arm) FROM runs r WHERE r.experiment_id = e.experiment_id),
                  (SELECT count(*) FROM rounds d JOIN runs r USING (run_id) WHERE r.experiment_id = e.experiment_id),
                  (SELECT count(*) FROM shards s JOIN runs r USING (run_id) WHERE r.experiment_id = e.experiment_id),
                  (SELECT max(committed_at) FROM shards s JOIN runs r USING (run_id) WHERE r.experiment_id = e.experiment_id)
           FROM experiments e WHERE e.experiment_id = ?""",
        [experiment_id],
    )
    return tuple(frame.row(0)) if frame.height else None
