"""Load: the report's data store — one frame per figure, each read once from a warehouse view.

Nothing here computes statistics or writes SQL: the views in ``warehouse.views`` compute,
``warehouse.report_queries`` reads them, so a number in a report is the number a user gets
from ``keynes sql``. Here frames are shaped for a page (arms numbered across experiments on a
comparison page, groups labelled by experiment).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import polars as pl

from core.game import History
from warehouse import report_queries as queries
from warehouse.llm_references import PAPER_MODELS, PAPER_SOURCE
from warehouse.provenance import provenance_rows, sessions
from warehouse.report_queries import experiment_index, experiment_version
from warehouse.store import Warehouse

__all__ = ["ExperimentNotFound", "ReportData", "experiment_ids", "experiment_index", "experiment_version", "list_experiments"]


class ExperimentNotFound(LookupError):
    """No experiment of that name or id in the warehouse."""


def list_experiments(warehouse: Warehouse) -> pl.DataFrame:
    """Every experiment in the warehouse, newest first (the ``experiment_overview`` view)."""
    return queries.experiment_overview(warehouse)


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
    grouped comparisons are keyed by "<experiment label>: <prompt mode / model / rule>" (``labels``).
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
        arms = queries.arm_rows(self.warehouse, self.experiment_ids).select("experiment_id", "arm")
        arms = arms.with_columns(pl.col("experiment_id").replace_strict(order, return_dtype=pl.Int64).alias("_order"))
        return arms.sort("_order", "arm").with_row_index("_page_arm").select(
            "experiment_id", "arm", pl.col("_page_arm").cast(pl.Int32))

    def _renumber(self, frame: pl.DataFrame, column: str = "arm") -> pl.DataFrame:
        if not self.comparing or column not in frame.columns or "experiment_id" not in frame.columns:
            return frame
        numbers = self._arm_numbers.rename({"arm": column, "_page_arm": "_new"})
        return frame.join(numbers, on=["experiment_id", column], how="left", maintain_order="left").with_columns(
            pl.col("_new").alias(column)).drop("_new")

    def _view(self, view: str, order: str = "") -> pl.DataFrame:
        frame = self._renumber(queries.view_rows(self.warehouse, view, self.experiment_ids, order))
        return frame.sort("arm", maintain_order=True) if self.comparing and "arm" in frame.columns else frame

    def _keyed(self, frame: pl.DataFrame, key: str) -> pl.DataFrame:
        """On a comparison page, a group of one experiment is "<label>: <group>"."""
        if not self.comparing:
            return frame
        return frame.with_columns(pl.concat_str(pl.col("experiment_id").replace_strict(self.labels, return_dtype=pl.String),
                                                pl.lit(": "), pl.col(key).cast(pl.String)).alias(key))

    @cached_property
    def names(self) -> dict[str, str]:
        """Experiment id → name."""
        return dict(self.experiments.select("experiment_id", "name").iter_rows())

    @cached_property
    def labels(self) -> dict[str, str]:
        """Experiment id → how the page names it: its name, or its id where another experiment of
        the page has the same name (two runs of one deployment: ``quickstart-f2314a5b``)."""
        names = list(self.names.values())
        return {e: name if names.count(name) == 1 else e for e, name in self.names.items()}

    @cached_property
    def experiments(self) -> pl.DataFrame:
        """The ``experiment_overview`` rows of the page's experiments, in the order given."""
        frame = queries.experiment_overview(self.warehouse, self.experiment_ids)
        missing = [e for e in self.experiment_ids if e not in frame["experiment_id"].to_list()]
        if missing:
            raise ExperimentNotFound(f"experiment {missing[0]!r} not found")
        order = {e: i for i, e in enumerate(self.experiment_ids)}
        return frame.sort(pl.col("experiment_id").replace_strict(order, return_dtype=pl.Int64))

    @cached_property
    def history(self) -> dict[str, str]:
        """Experiment id → what its agents were told of earlier rounds (``game.history`` in words;
        experiments stored before the setting existed: its default)."""
        configs = self.experiments.select("experiment_id", "config").iter_rows()
        return {e: History.model_validate(_loaded(c).get("game", {}).get("history", {})).describe() for e, c in configs}

    @cached_property
    def provenance(self) -> list[dict[str, Any]]:
        """What computed the page's experiments: one entry per session (``warehouse.provenance.sessions``)."""
        return sessions(provenance_rows(self.warehouse, self.experiment_ids))

    @cached_property
    def overview(self) -> dict[str, Any]:
        return self.experiments.row(0, named=True)

    @cached_property
    def arms(self) -> pl.DataFrame:
        """The arms; ``experiment_arm`` is each arm's number within its experiment."""
        frame = queries.arm_rows(self.warehouse, self.experiment_ids)
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
        return self._view("cognitive_hierarchy_fit", "arm, round, attribute, value").filter(pl.col("status") == "computed")

    @cached_property
    def exact_by_attribute(self) -> pl.DataFrame:
        """Shared-context answers: each arm's exact expected answer per round and persona attribute value."""
        return self._view("exact_answers_by_attribute", "arm, round, attribute, value")

    @cached_property
    def paired(self) -> pl.DataFrame:
        """Paired comparisons of arms that differ in one factor, per round."""
        frame = self._paired_rows.filter(pl.col("status") == "computed")
        return self._renumber(self._renumber(frame, "arm_a"), "arm_b")

    @cached_property
    def paired_missing(self) -> list[str]:
        """Why rounds of the page have no paired comparison (the view's status), each once."""
        return self._paired_rows.filter(pl.col("status") != "computed")["status"].unique(maintain_order=True).to_list()

    @cached_property
    def _paired_rows(self) -> pl.DataFrame:
        return queries.view_rows(self.warehouse, "paired_comparisons", self.experiment_ids, "arm_a, arm_b, round")

    @cached_property
    def highlights(self) -> pl.DataFrame:
        """Reasoning texts of the lowest, median and highest guesses and of winners, per arm and round."""
        return self._view("reasoning_highlights", "arm, round, guess")

    def reasoning_texts(self) -> pl.DataFrame:
        """Every reasoning text of the page's arms (the served page's searchable table)."""
        return self._view("reasoning_texts", "arm, round, agent_id")

    def _human(self, kind: str) -> pl.DataFrame:
        return self._renumber(queries.human_rows(self.warehouse, self.experiment_ids, kind)).drop("experiment_id")

    @cached_property
    def references(self) -> pl.DataFrame:
        """Human first-round results whose rule matches an arm's: arm, source, round, mean, median."""
        return self._human("result")

    @cached_property
    def human_tau(self) -> pl.DataFrame:
        """τ fitted to human subject pools that played an arm's rule: arm, pool, source, mean, τ, interval."""
        return self._human("cognitive hierarchy")

    @cached_property
    def llm_pools(self) -> pl.DataFrame:
        """Published LLM pools (``llm_reference``) that played an arm's rule, one row per arm and pool:
        arm, source, citation, url, model, prompt_mode, setting, round, statistic, value, n, same_model."""
        return self._renumber(queries.llm_rows(self.warehouse, self.experiment_ids)).drop("experiment_id")

    @cached_property
    def paper_rounds(self) -> pl.DataFrame:
        """The seed paper's average guesses beside each arm's round means, for the arm's prompt mode and round.

        One row per arm that plays the paper's game, round it played and model of the paper with a
        figure for that prompt mode and round, the paper's models in its order: arm, round, mean and
        n_valid (the arm's), model, value (the paper's), same_model; model and value are None on a
        round with no figure of the paper (every round, for a prompt mode it did not use).
        """
        paper = self.llm_pools.filter(pl.col("source") == PAPER_SOURCE).with_columns(pl.col("arm", "round").cast(pl.Int32))
        modes = self.arms.select(pl.col("arm").cast(pl.Int32), pl.col("prompt_mode").alias("arm_mode"))
        own = paper.join(modes, on="arm").filter(pl.col("prompt_mode") == pl.col("arm_mode")).select(
            "arm", "round", "model", "value", "same_model")
        played = self.rounds.select(pl.col("arm", "round").cast(pl.Int32), "mean", "n_valid").join(
            paper.select("arm").unique(), on="arm")
        rank = pl.col("model").replace_strict({m: i for i, m in enumerate(PAPER_MODELS)}, default=None, return_dtype=pl.Int32)
        return played.join(own, on=["arm", "round"], how="left").sort("arm", "round", rank, nulls_last=True)

    @cached_property
    def pool_table(self) -> pl.DataFrame:
        """The arms that play a published pool's game beside those pools, lowest round-1 mean first.

        One row per arm (``kind`` 'arm': its round-1 mean of valid guesses) and per published pool
        (``kind`` 'published'): player, prompt_mode, mean, n, source, and ``same_model``, the
        other side of a model match (the pool's name for an arm, the arms for a pool) or None;
        ``arm`` is the arm's number, or for a pool the first arm of its model.
        """
        pools = self.llm_pools.filter((pl.col("round") == 1) & (pl.col("statistic") == "mean"))
        if pools.is_empty():
            return pl.DataFrame()
        pools = pools.with_columns(player=pl.format("{} · {} · {}", pl.col("model"), pl.col("source").str.split(" (").list.first(),
                                                    pl.col("prompt_mode")))
        labels = {a: self.arm_label(a) for a in pools["arm"].unique().to_list()}
        matched = pools.filter(pl.col("same_model"))
        first = self.rounds.filter(pl.col("round") == 1).select("arm", "mean", "n_valid")
        arms = pl.DataFrame({"arm": sorted(labels)}, schema={"arm": pl.Int32}).join(
            self.arms.select(pl.col("arm").cast(pl.Int32), "prompt_mode"), on="arm", how="left").join(
            first.with_columns(pl.col("arm").cast(pl.Int32)), on="arm", how="left")
        arm_rows = arms.with_columns(
            kind=pl.lit("arm"), player=pl.col("arm").replace_strict(labels, return_dtype=pl.String),
            n=pl.col("n_valid").cast(pl.Int64), source=pl.lit("this page"),
            same_model=pl.col("arm").replace_strict(
                {a: ", ".join(g["player"]) for (a,), g in matched.group_by("arm")}, default=None, return_dtype=pl.String))
        by_pool = matched.group_by("player").agg(pl.col("arm").min().alias("first_arm"), pl.col("arm").sort().alias("arms"))
        pool_rows = pools.unique("player", maintain_order=True).join(by_pool, on="player", how="left").with_columns(
            kind=pl.lit("published"), mean=pl.col("value"), arm=pl.col("first_arm").cast(pl.Int32),
            same_model=pl.col("arms").list.eval(pl.format("arm {}", pl.element())).list.join(", "))
        columns = ["kind", "arm", "player", "prompt_mode", "mean", "n", "source", "same_model"]
        return pl.concat([arm_rows.select(columns), pool_rows.select(columns)]).sort("mean", "kind", nulls_last=True)

    def arm_label(self, arm: int) -> str:
        """A short label: "arm 0 · basic · simulated/uniform" (on a comparison page, "<label> · arm 0 · …")."""
        row = self.arms.filter(pl.col("arm") == arm).row(0, named=True)
        if self.comparing:
            return f"{self.labels[row['experiment_id']]} · arm {row['experiment_arm']} · {row['prompt_mode']} · {row['model']}"
        return f"arm {arm} · {row['prompt_mode']} · {row['model']}"


def _loaded(config: Any) -> dict[str, Any]:
    """A stored config: DuckDB hands JSON columns over as text."""
    return json.loads(config) if isinstance(config, str) else config
