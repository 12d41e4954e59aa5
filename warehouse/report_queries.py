"""The queries behind the report pages: every SELECT a page runs, over the warehouse views.

Nothing here computes statistics: the views in ``warehouse.views`` do, so a number in a
report is the number a user gets from ``keynes sql``. ``reports/data.py`` shapes these
frames for a page (arm numbering across experiments, group labels); it writes no SQL.
"""

from __future__ import annotations

import polars as pl

from warehouse.store import Warehouse

#: The views a page reads whole, filtered to its experiments (``view_rows``).
PAGE_VIEWS = frozenset({
    "round_summary", "convergence", "guess_histogram", "guess_stats_by_prompt_mode", "guess_stats_by_model",
    "guess_stats_by_rule", "guess_stats_by_attribute", "population_composition", "invalid_answers", "invalid_reasons",
    "usage_by_arm", "reasoning_depth", "cognitive_hierarchy_fit", "exact_answers_by_attribute", "paired_comparisons",
    "reasoning_highlights", "reasoning_texts",
})


def experiment_overview(warehouse: Warehouse, experiment_ids: list[str] | None = None) -> pl.DataFrame:
    """``experiment_overview`` rows: every experiment newest first, or those of ``experiment_ids``."""
    if experiment_ids is None:
        return warehouse.query("SELECT * FROM experiment_overview ORDER BY created_at DESC")
    return warehouse.query("SELECT * FROM experiment_overview WHERE list_contains(?, experiment_id)", [experiment_ids])


def arm_rows(warehouse: Warehouse, experiment_ids: list[str]) -> pl.DataFrame:
    """The ``arms`` rows of these experiments, with ``experiment_arm`` (the arm's number in its experiment)."""
    return warehouse.query("SELECT *, arm AS experiment_arm FROM arms WHERE list_contains(?, experiment_id) ORDER BY arm",
                           [experiment_ids])


def view_rows(warehouse: Warehouse, view: str, experiment_ids: list[str], order: str = "") -> pl.DataFrame:
    """A page view's rows for these experiments, ordered by ``order`` (columns of the view)."""
    if view not in PAGE_VIEWS:
        raise ValueError(f"{view!r} is not a report view")
    sql = f"SELECT * FROM {view} WHERE list_contains(?, experiment_id) {('ORDER BY ' + order) if order else ''}"
    return warehouse.query(sql, [experiment_ids])


def human_rows(warehouse: Warehouse, experiment_ids: list[str], kind: str) -> pl.DataFrame:
    """Published human results (``kind = 'result'``) or τ fits (``'cognitive hierarchy'``) whose
    rule matches an arm's: experiment_id, arm, then the reference's columns."""
    columns = ("h.source, h.round, h.mean, h.median" if kind == "result"
               else "h.pool, h.source, h.n, h.mean, h.tau, h.tau_low, h.tau_high")
    return warehouse.query(
        f"""SELECT a.experiment_id, a.arm, {columns}
            FROM arms a JOIN human_reference h
              ON h.ratio = a.ratio AND h."offset" = a."offset" AND h.low = a.low AND h.high = a.high
            WHERE list_contains(?, a.experiment_id) AND h.kind = ? ORDER BY a.arm, h.round, h.mean""",
        [experiment_ids, kind],
    )


def llm_rows(warehouse: Warehouse, experiment_ids: list[str]) -> pl.DataFrame:
    """Published LLM pools (``llm_reference``) whose game rule matches an arm's: experiment_id, arm,
    the reference's columns, and ``same_model`` (the arm's model matches the pool's ``model_match``)."""
    return warehouse.query(
        """SELECT a.experiment_id, a.arm, l.source, l.citation, l.url, l.model, l.model_id, l.prompt_mode, l.setting,
                  l.players, l.runs, l.round, l.statistic, l.value, l.n,
                  regexp_matches(a.model, l.model_match, 'i') AS same_model
           FROM arms a JOIN llm_reference l
             ON l.ratio = a.ratio AND l."offset" = a."offset" AND l.low = a.low AND l.high = a.high
           WHERE list_contains(?, a.experiment_id) ORDER BY a.arm, l.round, l.value, l.model""",
        [experiment_ids],
    )


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
