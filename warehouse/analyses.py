"""Fill the analyses that SQL cannot compute: cognitive-hierarchy τ fits and paired tests.

``refresh`` finds committed rounds whose analyses are missing (or were computed by an older
method), counts their valid guesses by value in SQL (paired tests read them agent by agent),
computes them with ``warehouse.depth`` and writes the tables ``tau_fits`` and ``paired_tests``
— shown by the views ``cognitive_hierarchy_fit`` and ``paired_comparisons``. With nothing
missing it costs three small queries, so every report build calls it. A committed round never
changes, so a stored result stays true.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any

import polars as pl

from core.game import GameRule
from warehouse.depth import RESAMPLES, fit_tau_to_counts, hierarchy_for, paired_test, seed_for
from warehouse.store import Warehouse

#: Stored with every row; rows of another method are recomputed.
TAU_METHOD = f"CH mean matched by brentq; bootstrap percentile interval, {RESAMPLES} resamples; v1"
PAIRED_METHOD = "paired t interval; Wilcoxon signed-rank (scipy.stats); v1"

#: The factors arms differ in, and the runs columns that make each one.
FACTORS: dict[str, tuple[str, ...]] = {
    "prompt mode": ("prompt_mode",),
    "model": ("engine", "model"),
    "temperature": ("temperature",),
    "game": ("ratio", "offset", "low", "high", "answers", "tolerance"),
}

_TAU_COLUMNS = ["run_id", "round", "attribute", "value", "n", "mean", "tau", "tau_low", "tau_high", "fit",
                "ch_mean_min", "ch_mean_max", "method"]
_PAIRED_COLUMNS = ["run_a", "run_b", "round", "factor", "level_a", "level_b", "n_pairs", "mean_a", "mean_b",
                   "mean_difference", "ci95_low", "ci95_high", "median_difference", "wilcoxon_statistic",
                   "wilcoxon_p", "note", "method"]


@dataclass(frozen=True, order=True)
class Pair:
    """Two arms of one experiment that differ in exactly one factor (a is the lower arm)."""

    experiment_id: str
    run_a: str
    run_b: str
    factor: str
    level_a: str
    level_b: str


def _level(arm: dict[str, Any], factor: str) -> str:
    if factor == "temperature":
        return f"{arm['temperature']:g}"
    if factor == "game":
        return arm["rule"]
    return str(arm[FACTORS[factor][-1]])


def arm_pairs(arms: pl.DataFrame) -> list[Pair]:
    """Every pair of arms of one experiment that differ in exactly one of ``FACTORS``."""
    pairs = []
    for (experiment_id,), group in arms.sort("arm").group_by("experiment_id", maintain_order=True):
        for a, b in combinations(group.to_dicts(), 2):
            differ = [f for f, columns in FACTORS.items() if any(a[c] != b[c] for c in columns)]
            if len(differ) == 1:
                f = differ[0]
                pairs.append(Pair(experiment_id, a["run_id"], b["run_id"], f, _level(a, f), _level(b, f)))
    return pairs


def _rule(arm: dict[str, Any]) -> GameRule:
    return GameRule(ratio=arm["ratio"], offset=arm["offset"], low=arm["low"], high=arm["high"], answers=arm["answers"])


def refresh(warehouse: Warehouse, experiment_ids: list[str] | None = None) -> dict[str, int]:
    """Compute and store the missing τ fits and paired tests; return how many rows were written.

    Args:
        warehouse: the warehouse (written through short transactions, one per experiment).
        experiment_ids: the experiments to bring up to date; None means all.
    """
    where = "" if experiment_ids is None else "WHERE list_contains(?, experiment_id)"
    params = None if experiment_ids is None else [list(experiment_ids)]
    arms = warehouse.query(
        f"""SELECT a.run_id, a.experiment_id, a.arm, a.engine, a.model, a.prompt_mode, a.temperature, a.ratio,
                   a."offset", a.low, a.high, a.answers, r.tolerance, a.rule
            FROM arms a JOIN runs r USING (run_id) {where.replace('experiment_id', 'a.experiment_id')}""", params)
    if arms.is_empty():
        return {"tau_fits": 0, "paired_tests": 0}
    runs = arms["run_id"].to_list()
    committed = set(warehouse.query("SELECT run_id, round FROM rounds WHERE list_contains(?, run_id)", [runs]).iter_rows())
    fitted = set(warehouse.query("SELECT DISTINCT run_id, round FROM tau_fits WHERE method = ? AND list_contains(?, run_id)",
                                 [TAU_METHOD, runs]).iter_rows())
    tested = set(warehouse.query("SELECT run_a, run_b, round FROM paired_tests WHERE method = ? AND list_contains(?, run_a)",
                                 [PAIRED_METHOD, runs]).iter_rows())
    rounds_of: dict[str, set[int]] = {}
    for run_id, round_ in committed:
        rounds_of.setdefault(run_id, set()).add(round_)
    written = {"tau_fits": 0, "paired_tests": 0}
    by_run = {a["run_id"]: a for a in arms.to_dicts()}
    pairs = arm_pairs(arms)
    for experiment_id in arms["experiment_id"].unique(maintain_order=True).to_list():
        fits = sorted((r, k) for r, k in committed - fitted if by_run[r]["experiment_id"] == experiment_id)
        tests = sorted(
            (p, k) for p in pairs if p.experiment_id == experiment_id
            for k in rounds_of.get(p.run_a, set()) & rounds_of.get(p.run_b, set())
            if (p.run_a, p.run_b, k) not in tested
        )
        if fits or tests:
            tau_rows, paired_rows = _compute(warehouse, experiment_id, by_run, fits, tests)
            _store(warehouse, fits, tests, tau_rows, paired_rows)
            written["tau_fits"] += len(tau_rows)
            written["paired_tests"] += len(paired_rows)
    return written


def _compute(warehouse: Warehouse, experiment_id: str, by_run: dict[str, dict], fits: list[tuple[str, int]],
             tests: list[tuple[Pair, int]]) -> tuple[list[dict], list[dict]]:
    """The rows of one experiment's missing fits and tests, a round at a time.

    A fit needs only how many agents named each value: DuckDB counts them (a few hundred rows
    for a million agents, per persona attribute too); a paired test needs each agent's two
    guesses, read for the rounds and arms it compares.
    """
    tau_rows: list[dict] = []
    paired_rows: list[dict] = []
    for round_ in sorted({k for _, k in fits} | {k for _, k in tests}):
        fit_runs = sorted(r for r, k in fits if k == round_)
        if fit_runs:
            counts = _guess_counts(warehouse, experiment_id, round_, fit_runs)
            for run_id in fit_runs:
                hierarchy = hierarchy_for(_rule(by_run[run_id]))
                own = counts.filter(pl.col("run_id") == run_id)
                for (attribute, value), group in own.group_by("attribute", "value", maintain_order=True):
                    result = fit_tau_to_counts(group["guess"].to_numpy(), group["n"].to_numpy(), hierarchy,
                                               seed_for(run_id, round_, attribute, value))
                    tau_rows.append({"run_id": run_id, "round": round_, "attribute": attribute, "value": value,
                                     **asdict(result), "method": TAU_METHOD})
        round_tests = [p for p, k in tests if k == round_]
        if round_tests:
            needed = sorted({p.run_a for p in round_tests} | {p.run_b for p in round_tests})
            guesses = warehouse.query(
                "SELECT run_id, agent_id, guess FROM guesses WHERE round = ? AND valid AND list_contains(?, run_id)",
                [round_, needed])
        for pair in round_tests:
            joined = guesses.filter(pl.col("run_id") == pair.run_a).join(
                guesses.filter(pl.col("run_id") == pair.run_b), on="agent_id", suffix="_b")
            result = paired_test(joined["guess"].to_numpy(), joined["guess_b"].to_numpy())
            paired_rows.append({"run_a": pair.run_a, "run_b": pair.run_b, "round": round_, "factor": pair.factor,
                                "level_a": pair.level_a, "level_b": pair.level_b, **asdict(result),
                                "method": PAIRED_METHOD})
    return tau_rows, paired_rows


def _guess_counts(warehouse: Warehouse, experiment_id: str, round_: int, runs: list[str]) -> pl.DataFrame:
    """Valid guesses of ``runs`` in ``round_`` counted by value: every run's whole population
    (attribute and value null) first, then each persona attribute's values in order; within
    each, the guesses ascending. A run with no valid guess still gets its whole-population row
    (guess null, n 0), so its fit says so."""
    return warehouse.query(
        """WITH g AS (SELECT run_id, agent_id, guess FROM guesses WHERE round = ? AND valid AND list_contains(?, run_id)),
                whole AS (SELECT r.run_id, NULL::VARCHAR AS attribute, NULL::VARCHAR AS value, g.guess,
                                 count(g.guess) AS n
                          FROM unnest(?::VARCHAR[]) AS r(run_id) LEFT JOIN g USING (run_id) GROUP BY ALL),
                split AS (SELECT g.run_id, a.attribute, a.value, g.guess, count(*) AS n
                          FROM g JOIN persona_attributes a ON a.experiment_id = ? AND a.agent_id = g.agent_id
                          GROUP BY ALL)
           SELECT * FROM (SELECT * FROM whole UNION ALL SELECT * FROM split)
           ORDER BY run_id, attribute NULLS FIRST, value, guess""",
        [round_, runs, runs, experiment_id])


def _store(warehouse: Warehouse, fits: list[tuple[str, int]], tests: list[tuple[Pair, int]],
           tau_rows: list[dict], paired_rows: list[dict]) -> None:
    """Replace the rows of these (run, round) fits and (pair, round) tests in one transaction."""
    tau = pl.DataFrame(tau_rows, schema={c: _TYPES.get(c, pl.Float64) for c in _TAU_COLUMNS})
    paired = pl.DataFrame(paired_rows, schema={c: _TYPES.get(c, pl.Float64) for c in _PAIRED_COLUMNS})
    with warehouse.transaction() as con:
        for run_id, round_ in fits:
            con.execute("DELETE FROM tau_fits WHERE run_id = ? AND round = ?", [run_id, round_])
        for pair, round_ in tests:
            con.execute("DELETE FROM paired_tests WHERE run_a = ? AND run_b = ? AND round = ?", [pair.run_a, pair.run_b, round_])
        con.register("new_tau_fits", tau.to_arrow())
        con.execute(f"INSERT INTO tau_fits ({', '.join(_TAU_COLUMNS)}) SELECT {', '.join(_TAU_COLUMNS)} FROM new_tau_fits")
        con.unregister("new_tau_fits")
        con.register("new_paired_tests", paired.to_arrow())
        con.execute(f"INSERT INTO paired_tests ({', '.join(_PAIRED_COLUMNS)}) "
                    f"SELECT {', '.join(_PAIRED_COLUMNS)} FROM new_paired_tests")
        con.unregister("new_paired_tests")


_TYPES: dict[str, Any] = {
    "run_id": pl.String, "run_a": pl.String, "run_b": pl.String, "round": pl.Int32, "attribute": pl.String,
    "value": pl.String, "fit": pl.String, "method": pl.String, "factor": pl.String, "level_a": pl.String,
    "level_b": pl.String, "note": pl.String, "n": pl.Int64, "n_pairs": pl.Int64,
}
