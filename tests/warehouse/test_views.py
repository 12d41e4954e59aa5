"""Every named view against an independent recomputation from the raw ``guesses`` rows."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tests.warehouse.conftest import EXPERIMENT, ROUNDS, N

pytestmark = pytest.mark.quick

KEY = ["run_id", "round"]


@pytest.fixture(scope="module")
def raw(filled):
    """The raw tables, read once: guesses joined to their runs, and personas."""
    guesses = filled.query("SELECT g.*, r.prompt_mode, r.ratio_value, r.\"offset\", r.low, r.high, r.equilibrium, r.arm "
                           "FROM guesses g JOIN runs r USING (run_id)")
    personas = filled.query("SELECT * FROM personas")
    return guesses, personas


def stats(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """n, n_valid, mean, median, sample sd of valid guesses — computed in polars."""
    return frame.group_by(by).agg(
        n=pl.len(), n_valid=pl.col("guess").is_not_null().sum(),
        mean=pl.col("guess").mean(), median=pl.col("guess").median(), sd=pl.col("guess").std(),
    )


def assert_same(view: pl.DataFrame, expected: pl.DataFrame, on: list[str], columns: list[str]) -> None:
    joined = expected.join(view, on=on, how="full", suffix="_view", coalesce=True)
    assert joined.height == expected.height == view.height, (joined.height, expected.height, view.height)
    for c in columns:
        np.testing.assert_allclose(joined[f"{c}_view"].to_numpy().astype(float), joined[c].to_numpy().astype(float),
                                   rtol=1e-9, atol=1e-9, err_msg=c)


def test_round_summary_matches_guesses(filled, raw):
    guesses, _ = raw
    view = filled.query("SELECT * FROM round_summary")
    expected = stats(guesses, KEY + ["ratio_value", "offset", "low", "high", "equilibrium"]).with_columns(
        target=(pl.col("ratio_value") * pl.col("mean") + pl.col("offset")).clip(pl.col("low"), pl.col("high")),
        distance_to_equilibrium=(pl.col("mean") - pl.col("equilibrium")).abs(),
        invalid_rate=1 - pl.col("n_valid") / pl.col("n"),
    )
    assert view.height == 3 * ROUNDS
    assert_same(view, expected, KEY, ["n", "n_valid", "mean", "median", "sd", "target", "distance_to_equilibrium", "invalid_rate"])


def test_convergence_tracks_distance_and_change(filled, raw):
    guesses, _ = raw
    view = filled.query("SELECT * FROM convergence")
    expected = stats(guesses, KEY + ["equilibrium"]).sort(KEY).with_columns(
        distance_to_equilibrium=(pl.col("mean") - pl.col("equilibrium")).abs(),
        mean_change=pl.col("mean").diff().over("run_id").fill_null(np.nan),
    ).with_columns(distance_share_of_round1=pl.col("distance_to_equilibrium") / pl.col("distance_to_equilibrium").first().over("run_id"))
    view = view.with_columns(pl.col("mean_change").fill_null(np.nan))
    assert_same(view, expected, KEY, ["mean", "distance_to_equilibrium", "mean_change", "distance_share_of_round1"])
    winners = filled.query("SELECT run_id, round, winning_guess FROM rounds")
    assert_same(view.select(KEY + ["winning_guess"]), winners, KEY, ["winning_guess"])


@pytest.mark.parametrize("view, by", [
    ("guess_stats_by_prompt_mode", ["prompt_mode"]),
    ("guess_stats_by_model", ["model"]),
    ("guess_stats_by_rule", ["ratio_value", "offset"]),
])
def test_grouped_stats_match_guesses(filled, raw, view, by):
    guesses, _ = raw
    frame = filled.query(f"SELECT * FROM {view}")
    if view == "guess_stats_by_rule":
        frame = frame.with_columns(ratio_value=pl.col("ratio").map_elements(lambda r: eval(r), return_dtype=pl.Float64))
    expected = stats(guesses, by + ["round"]).with_columns(
        se=pl.col("sd") / pl.col("n_valid").sqrt()).with_columns(ci95_low=pl.col("mean") - 1.96 * pl.col("se"))
    assert_same(frame, expected, by + ["round"], ["n", "n_valid", "mean", "median", "sd", "se", "ci95_low"])
    # two groups of each kind in the fixture, each over every round
    assert frame.height == 2 * ROUNDS


def age_band(age: int) -> str:
    for limit, band in [(25, "18–24"), (35, "25–34"), (45, "35–44"), (55, "45–54"), (65, "55–64")]:
        if age < limit:
            return band
    return "65+"


def test_one_long_view_covers_every_demographic_attribute(filled, raw):
    guesses, personas = raw
    long = personas.with_columns(age_band=pl.col("age").map_elements(age_band, return_dtype=pl.String)).unpivot(
        index=["experiment_id", "agent_id"], on=["education", "gender", "occupation", "age_band"],
        variable_name="attribute", value_name="value")
    view = filled.query("SELECT * FROM guess_stats_by_attribute")
    # raw numeric age has too many values to be a category: only its bands appear
    assert set(view["attribute"].unique()) == {"education", "gender", "occupation", "age_band"}
    expected = stats(guesses.join(long, on="agent_id"), ["run_id", "round", "attribute", "value"])
    assert_same(view, expected, ["run_id", "round", "attribute", "value"], ["n", "n_valid", "mean", "median", "sd"])


def test_population_composition_counts_every_agent(filled, raw):
    _, personas = raw
    view = filled.query("SELECT * FROM population_composition")
    for attribute in ("education", "gender", "occupation"):
        part = view.filter(pl.col("attribute") == attribute)
        expected = personas.group_by(pl.col(attribute).alias("value")).len()
        assert dict(zip(part["value"], part["n"])) == dict(zip(expected["value"], expected["len"]))
        assert part["share"].sum() == pytest.approx(1.0)
    assert view.filter(pl.col("attribute") == "age_band")["n"].sum() == N


def test_invalid_answers_and_reasons(filled, raw):
    guesses, _ = raw
    view = filled.query("SELECT * FROM invalid_answers")
    expected = guesses.group_by(KEY).agg(n=pl.len(), n_invalid=(~pl.col("valid")).sum()).with_columns(
        invalid_rate=pl.col("n_invalid") / pl.col("n"))
    assert_same(view, expected, KEY, ["n", "n_invalid", "invalid_rate"])
    assert expected["n_invalid"].sum() > 0  # the fixture has unparseable answers
    reasons = filled.query("SELECT * FROM invalid_reasons")
    expected = guesses.filter(~pl.col("valid")).group_by("run_id", "error").len()
    assert dict(zip(zip(reasons["run_id"], reasons["error"]), reasons["n"])) == \
        dict(zip(zip(expected["run_id"], expected["error"]), expected["len"]))


def test_usage_by_arm(filled, raw):
    guesses, _ = raw
    view = filled.query("SELECT * FROM usage_by_arm").sort("run_id")
    for row in view.iter_rows(named=True):
        g = guesses.filter(pl.col("run_id") == row["run_id"])
        latency = g["latency_s"].to_numpy()
        assert row["guesses"] == g.height
        assert row["prompt_tokens"] == g["prompt_tokens"].sum()
        assert row["completion_tokens"] == g["completion_tokens"].sum()
        assert row["latency_mean_s"] == pytest.approx(latency.mean())
        assert row["latency_p50_s"] == pytest.approx(np.quantile(latency, 0.5))
        assert row["latency_p95_s"] == pytest.approx(np.quantile(latency, 0.95))
        assert row["retries"] == (g["attempts"] - 1).sum()
        assert row["play_s"] == pytest.approx(1.25 * ROUNDS)


def test_histogram_bins_every_valid_guess(filled, raw):
    guesses, _ = raw
    view = filled.query("SELECT * FROM guess_histogram")
    for (run_id, round_), g in guesses.filter(pl.col("valid")).group_by(KEY):
        counts, edges = np.histogram(g["guess"].to_numpy(), bins=50, range=(0, 100))
        h = view.filter((pl.col("run_id") == run_id) & (pl.col("round") == round_)).sort("bin_low")
        got = dict(zip(h["bin_low"].to_list(), h["n"].to_list()))
        assert got == {float(edges[i]): int(c) for i, c in enumerate(counts) if c}


def test_overview_and_arms(filled, raw):
    guesses, _ = raw
    o = filled.query("SELECT * FROM experiment_overview").row(0, named=True)
    assert (o["experiment_id"], o["population"], o["arms"], o["rounds_played"]) == (EXPERIMENT, N, 3, 3 * ROUNDS)
    assert (o["guesses"], o["valid_guesses"]) == (guesses.height, guesses["valid"].sum())
    rules = filled.query("SELECT arm, rule FROM arms ORDER BY arm")["rule"].to_list()
    assert rules == ["2/3 × mean in [0, 100]", "2/3 × mean in [0, 100]", "1/2 × mean + 5 in [0, 100]"]


def test_human_reference_names_its_source(filled):
    ref = filled.query("SELECT * FROM human_reference WHERE kind = 'result' AND ratio = '2/3' AND round = 1").row(0, named=True)
    assert "Nagel (1995)" in ref["source"]
    assert (ref["mean"], ref["median"]) == (36.73, 33.0)


def test_views_carry_descriptions(filled):
    comments = filled.query("SELECT view_name, comment FROM duckdb_views() WHERE NOT internal")
    assert comments.height >= 15
    assert all("[keynes:" in c and len(c) > 40 for c in comments["comment"])
