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
    """The numbers behind one page, each frame read once from a view.

    ``experiment_id`` is one experiment, or a list of several for a comparison page: then arms
    are numbered across the experiments in the order given (experiment A's arms first) and
    grouped comparisons are keyed by "<experiment name>: <prompt mode / model / rule>".
    """

    warehouse: Warehouse
    experiment_id: str | list[str]

    @property
    def experiment_ids(self) -> list[str]:
        return [self.experiment_id] if isinstance(self.experiment_id, str) else list(self.experiment_id)

    @property
    def comparing(self) -> bool:
        """Several experiments on one page."""
        return len(self.experiment_ids) > 1

    @cached_property
    def _arm_numbers(self) -> pl.DataFrame:
        """(experiment_id, arm) → the arm's number on this page."""
        order = {e: i for i, e in enumerate(self.experiment_ids)}
        arms = self.warehouse.query("SELECT experiment_id, arm FROM arms WHERE list_contains(?, experiment_id)",
                                    [self.experiment_ids])
        arms = arms.with_columns(pl.col("experiment_id").replace_strict(order, return_dtype=pl.Int64).alias("_order"))
        return arms.sort("_order", "arm").with_row_index("_page_arm").select(
            "experiment_id", "arm", pl.col("_page_arm").cast(pl.Int32))

    def _renumber(self, frame: pl.DataFrame, column: str = "arm") -> pl.DataFrame:
        if not self.comparing or column not in frame.columns or "experiment_id" not in frame.columns:
            return frame
        numbers = self._arm_numbers.rename({"arm": column, "_page_arm": "_new"})
        return frame.join(numbers, on=["experiment_id", column], how="left", maintain_order="left").with_columns(
            pl.col("_new").alias(column)).drop("_new")

    def _view(self, view: str, order: str = "", where: str = "") -> pl.DataFrame:
        sql = f"SELECT * FROM {view} WHERE list_contains(?, experiment_id) {where} {('ORDER BY ' + order) if order else ''}"
        frame = self._renumber(self.warehouse.query(sql, [self.experiment_ids]))
        return frame.sort("arm", maintain_order=True) if self.comparing and "arm" in frame.columns else frame

    def _keyed(self, frame: pl.DataFrame, key: str) -> pl.DataFrame:
        """On a comparison page, a group of one experiment is "<name>: <group>"."""
        if not self.comparing:
            return frame
        names = self.names
        return frame.with_columns(pl.concat_str(pl.col("experiment_id").replace_strict(names, return_dtype=pl.String),
                                                pl.lit(": "), pl.col(key).cast(pl.String)).alias(key))

    @cached_property
    def names(self) -> dict[str, str]:
        """Experiment id → name."""
        return dict(self.experiments.select("experiment_id", "name").iter_rows())

    @cached_property
    def experiments(self) -> pl.DataFrame:
        """The ``experiment_overview`` rows of the page's experiments, in the order given."""
        frame = self.warehouse.query("SELECT * FROM experiment_overview WHERE list_contains(?, experiment_id)",
                                     [self.experiment_ids])
        missing = [e for e in self.experiment_ids if e not in frame["experiment_id"].to_list()]
        if missing:
            raise ExperimentNotFound(f"experiment {missing[0]!r} not found")
        order = {e: i for i, e in enumerate(self.experiment_ids)}
        return frame.sort(pl.col("experiment_id").replace_strict(order, return_dtype=pl.Int64))

    @cached_property
    def overview(self) -> dict[str, Any]:
        return self.experiments.row(0, named=True)

    @cached_property
    def arms(self) -> pl.DataFrame:
        """The arms; ``experiment_arm`` is each arm's number within its experiment."""
        frame = self.warehouse.query("SELECT *, arm AS experiment_arm FROM arms WHERE list_contains(?, experiment_id) "
                                     "ORDER BY arm", [self.experiment_ids])
        return self._renumber(frame).sort("arm")

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
        return self._keyed(self._view("guess_stats_by_prompt_mode", "prompt_mode, round"), "prompt_mode")

    @cached_property
    def by_model(self) -> pl.DataFrame:
        return self._keyed(self._view("guess_stats_by_model", "model, round"), "model")

    @cached_property
    def by_rule(self) -> pl.DataFrame:
        return self._keyed(self._view("guess_stats_by_rule", "rule, round"), "rule")

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
    def depth(self) -> pl.DataFrame:
        """Level-k class shares per arm and round, and per persona attribute value."""
        return self._view("reasoning_depth", "arm, round, attribute, value, class_rank")

    @cached_property
    def tau(self) -> pl.DataFrame:
        """Cognitive-hierarchy τ per arm and round, and per persona attribute value."""
        return self._view("cognitive_hierarchy_fit", "arm, round, attribute, value")

    @cached_property
    def exact_by_attribute(self) -> pl.DataFrame:
        """Shared-context answers: each arm's exact expected answer per round and persona attribute value."""
        return self._view("exact_answers_by_attribute", "arm, round, attribute, value")

    @cached_property
    def paired(self) -> pl.DataFrame:
        """Paired comparisons of arms that differ in one factor, per round."""
        frame = self.warehouse.query(
            "SELECT * FROM paired_comparisons WHERE list_contains(?, experiment_id) ORDER BY arm_a, arm_b, round",
            [self.experiment_ids])
        return self._renumber(self._renumber(frame, "arm_a"), "arm_b")

    @cached_property
    def highlights(self) -> pl.DataFrame:
        """Reasoning texts of the lowest, median and highest guesses and of winners, per arm and round."""
        return self._view("reasoning_highlights", "arm, round, guess")

    def reasoning_texts(self) -> pl.DataFrame:
        """Every reasoning text of the page's arms (the served page's searchable table)."""
        return self._view("reasoning_texts", "arm, round, agent_id")

    def _human(self, kind: str, columns: str) -> pl.DataFrame:
        frame = self.warehouse.query(
            f"""SELECT a.experiment_id, a.arm, {columns}
                FROM arms a JOIN human_reference h
                  ON h.ratio = a.ratio AND h."offset" = a."offset" AND h.low = a.low AND h.high = a.high
                WHERE list_contains(?, a.experiment_id) AND h.kind = ? ORDER BY a.arm, h.round, h.mean""",
            [self.experiment_ids, kind],
        )
        return self._renumber(frame).drop("experiment_id")

    @cached_property
    def references(self) -> pl.DataFrame:
        """Human first-round results whose rule matches an arm's: arm, source, round, mean, median."""
        return self._human("result", "h.source, h.round, h.mean, h.median")

    @cached_property
    def human_tau(self) -> pl.DataFrame:
        """τ fitted to human subject pools that played an arm's rule: arm, pool, source, mean, τ, interval."""
        return self._human("cognitive hierarchy", "h.pool, h.source, h.n, h.mean, h.tau, h.tau_low, h.tau_high")

    def arm_label(self, arm: int) -> str:
        """A short label: "arm 0 · basic · simulated/uniform" (on a comparison page, "<name> · arm 0 · …")."""
        row = self.arms.filter(pl.col("arm") == arm).row(0, named=True)
        if self.comparing:
            return f"{self.names[row['experiment_id']]} · arm {row['experiment_arm']} · {row['prompt_mode']} · {row['model']}"
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
