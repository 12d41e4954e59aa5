"""Reasoning depth: level-k classes, τ fits and paired tests against independent recomputations.

The views and tables are filled from the seeded warehouse of ``conftest.fill``; every number is
recomputed here from the raw guesses in plain Python or polars, by other formulas where one
exists (classes by nearest step in log distance, CH by its definition, the t interval by hand).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats

from core.game import GameRule
from tests.warehouse.conftest import ARMS, EXPERIMENT, ROUNDS, N
from warehouse.analyses import PAIRED_METHOD, TAU_METHOD, refresh
from warehouse.depth import TAU_MAX, Hierarchy, bootstrap_means, fit_tau, paired_test
from warehouse.depth_views import EQUILIBRIUM_BAND

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def analysed(filled):
    first = refresh(filled)
    return filled, first


@pytest.fixture(scope="module")
def raw(filled):
    guesses = filled.query("SELECT g.run_id, g.round, g.agent_id, g.guess, r.arm FROM guesses g JOIN runs r USING (run_id) "
                           "WHERE g.valid")
    personas = filled.query("SELECT * FROM personas")
    return guesses, personas


def steps_by_hand(rule: GameRule) -> list[float]:
    """x_0 = midpoint, x_(k+1) = clamp(ratio·x_k + offset), while more than the band from equilibrium."""
    x, e, p = (rule.low + rule.high) / 2, rule.equilibrium, float(rule.fraction)
    out = []
    while abs(x - e) > EQUILIBRIUM_BAND and len(out) <= 60:
        out.append(x)
        x = min(max(p * x + rule.offset, rule.low), rule.high)
    return out


def class_by_hand(guess: float, rule: GameRule) -> str:
    """The step nearest in log distance to the equilibrium (the geometric-mean rule, stated another way)."""
    e = rule.equilibrium
    steps = steps_by_hand(rule)
    if abs(guess - e) <= EQUILIBRIUM_BAND:
        return "equilibrium"
    t = (guess - e) / (steps[0] - e)
    if t < 0:
        return "beyond equilibrium"
    s = [(x - e) / (steps[0] - e) for x in steps]
    # Step 0's class reaches as far above s_0 in log scale as below it.
    upper0 = s[0] / math.sqrt(s[1]) if len(s) > 1 else s[0] / (EQUILIBRIUM_BAND / abs(steps[0] - e))
    if t > upper0:
        return "above step 0"
    k = min(range(len(s)), key=lambda i: abs(math.log(t) - math.log(s[i])))
    return f"step {k}"


def test_level_k_steps_are_the_iterated_best_responses(analysed):
    wh, _ = analysed
    view = wh.query("SELECT * FROM level_k_steps ORDER BY run_id, level")
    for arm, _, _, rule in ARMS:
        mine = view.filter(pl.col("arm") == arm)
        assert mine["step"].to_list() == pytest.approx(steps_by_hand(rule), abs=1e-9)
    two_thirds = view.filter(pl.col("arm") == 0)
    # Nagel's neighbourhoods for 2/3: step k holds (50·p^(k+1/2), 50·p^(k−1/2)]
    p = 2 / 3
    for row in two_thirds.head(4).iter_rows(named=True):
        k = row["level"]
        assert row["guess_low"] == pytest.approx(50 * p ** (k + 0.5))
        assert row["guess_high"] == pytest.approx(50 * p ** (k - 0.5))


def test_every_valid_guess_is_classed_like_the_hand_computation(analysed, raw):
    wh, _ = analysed
    guesses, _ = raw
    view = wh.query("SELECT run_id, round, agent_id, class, level FROM guess_depth")
    assert view.height == guesses.height  # every valid guess once
    rules = {f"{EXPERIMENT}-arm{arm}": rule for arm, _, _, rule in ARMS}
    expected = guesses.with_columns(
        expected=pl.struct("run_id", "guess").map_elements(lambda r: class_by_hand(r["guess"], rules[r["run_id"]]),
                                                           return_dtype=pl.String))
    joined = expected.join(view, on=["run_id", "round", "agent_id"])
    mismatched = joined.filter(pl.col("class") != pl.col("expected"))
    assert mismatched.is_empty(), mismatched.head()
    assert joined.filter(pl.col("class").str.starts_with("step"))["level"].to_list() == \
        [int(c.split()[1]) for c in joined.filter(pl.col("class").str.starts_with("step"))["class"].to_list()]
    # the fixture's guesses reach every kind of class
    assert {"above step 0", "equilibrium", "beyond equilibrium", "step 0", "step 3"} <= set(view["class"].unique())


def test_reasoning_depth_shares_per_arm_and_per_group(analysed, raw):
    wh, _ = analysed
    guesses, personas = raw
    rules = {f"{EXPERIMENT}-arm{arm}": rule for arm, _, _, rule in ARMS}
    classed = guesses.with_columns(
        cls=pl.struct("run_id", "guess").map_elements(lambda r: class_by_hand(r["guess"], rules[r["run_id"]]),
                                                      return_dtype=pl.String))
    whole = classed.group_by("run_id", "round", "cls").len().with_columns(
        share=pl.col("len") / pl.col("len").sum().over("run_id", "round"))
    view = wh.query("SELECT * FROM reasoning_depth WHERE attribute IS NULL")
    joined = whole.join(view, left_on=["run_id", "round", "cls"], right_on=["run_id", "round", "class"], how="full")
    assert joined.height == whole.height == view.height
    np.testing.assert_allclose(joined["n"], joined["len"])
    np.testing.assert_allclose(joined["share_right"], joined["share"], rtol=1e-12)
    by_gender = classed.join(personas.select("agent_id", "gender"), on="agent_id").group_by(
        "run_id", "round", "gender", "cls").len()
    view = wh.query("SELECT run_id, round, value, class, n, share FROM reasoning_depth WHERE attribute = 'gender'")
    joined = by_gender.join(view, left_on=["run_id", "round", "gender", "cls"], right_on=["run_id", "round", "value", "class"])
    assert joined.height == by_gender.height == view.height
    assert (joined["n"] == joined["len"]).all()
    sums = view.group_by("run_id", "round", "value").agg(pl.col("share").sum())
    np.testing.assert_allclose(sums["share"], 1.0)


def ch_mean_by_hand(rule: GameRule, tau: float, levels: int = 80) -> float:
    """CH population mean from the definition (Camerer, Ho & Chong 2004), in plain Python."""
    p = float(rule.fraction)
    f = [math.exp(-tau)]
    for k in range(1, levels):
        f.append(f[-1] * tau / k)
    x = [(rule.low + rule.high) / 2]
    for k in range(1, levels):
        believed = sum(f[j] * x[j] for j in range(k)) / sum(f[:k])
        x.append(min(max(p * believed + rule.offset, rule.low), rule.high))
    return sum(a * b for a, b in zip(f, x))


def tau_by_bisection(rule: GameRule, mean: float) -> float | None:
    lo, hi = 0.0, TAU_MAX
    f_lo, f_hi = ch_mean_by_hand(rule, lo) - mean, ch_mean_by_hand(rule, hi) - mean
    if f_lo * f_hi > 0:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if (ch_mean_by_hand(rule, mid) - mean) * f_lo > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def test_tau_fits_invert_the_cognitive_hierarchy_mean(analysed, raw):
    wh, written = analysed
    guesses, personas = raw
    view = wh.query("SELECT * FROM cognitive_hierarchy_fit ORDER BY run_id, round, attribute, value")
    attributes = personas["education gender occupation".split()].columns + ["age_band"]
    # one row per arm × round for the whole arm, and one per attribute value
    values = sum(personas[a].n_unique() for a in attributes[:-1]) + 6  # six age bands among 18–89
    assert view.height == written["tau_fits"] == len(ARMS) * ROUNDS * (1 + values)
    whole = view.filter(pl.col("attribute").is_null())
    expected = guesses.group_by("run_id", "round").agg(n=pl.len(), mean=pl.col("guess").mean())
    joined = expected.join(whole, on=["run_id", "round"])
    assert joined.height == len(ARMS) * ROUNDS
    rules = {f"{EXPERIMENT}-arm{arm}": rule for arm, _, _, rule in ARMS}
    for row in joined.iter_rows(named=True):
        assert row["n"] == row["n_right"] and row["mean"] == pytest.approx(row["mean_right"], abs=1e-9)
        tau = tau_by_bisection(rules[row["run_id"]], row["mean"])
        if tau is None:
            assert row["fit"] == "no τ fits" and row["tau"] is None
        else:
            assert row["fit"] == "fitted" and row["tau"] == pytest.approx(tau, abs=1e-4)
            assert row["tau_low"] <= row["tau"] <= row["tau_high"]
    assert (whole["method"] == TAU_METHOD).all()
    by_gender = guesses.join(personas.select("agent_id", "gender"), on="agent_id").group_by(
        "run_id", "round", "gender").agg(n=pl.len(), mean=pl.col("guess").mean())
    got = view.filter(pl.col("attribute") == "gender").join(
        by_gender, left_on=["run_id", "round", "value"], right_on=["run_id", "round", "gender"])
    assert got.height == by_gender.height
    np.testing.assert_allclose(got["mean"], got["mean_right"], rtol=1e-12)
    assert (got["n"] == got["n_right"]).all()


def test_refresh_is_idempotent_and_deterministic(analysed):
    wh, _ = analysed
    assert refresh(wh) == {"tau_fits": 0, "paired_tests": 0}
    before = wh.query("SELECT * EXCLUDE (computed_at) FROM tau_fits ORDER BY ALL")
    with wh.transaction() as con:
        con.execute("DELETE FROM tau_fits WHERE round = 2")
        con.execute("DELETE FROM paired_tests")
    again = refresh(wh)
    assert again["tau_fits"] == before.filter(pl.col("round") == 2).height and again["paired_tests"] == ROUNDS
    after = wh.query("SELECT * EXCLUDE (computed_at) FROM tau_fits ORDER BY ALL")
    assert after.equals(before)  # seeded bootstrap: the same intervals


def test_paired_comparisons_pair_arms_differing_in_one_factor(analysed, raw):
    wh, _ = analysed
    guesses, _ = raw
    view = wh.query("SELECT * FROM paired_comparisons ORDER BY round")
    # arms 0 and 1 differ only in the prompt mode; arm 2 differs from both in model and game
    assert set(zip(view["arm_a"], view["arm_b"], view["factor"])) == {(0, 1, "prompt mode")}
    assert view["round"].to_list() == list(range(1, ROUNDS + 1))
    assert set(zip(view["level_a"], view["level_b"])) == {("basic", "cot")}
    assert (view["method"] == PAIRED_METHOD).all()
    for row in view.iter_rows(named=True):
        a = guesses.filter((pl.col("arm") == 0) & (pl.col("round") == row["round"]))
        b = guesses.filter((pl.col("arm") == 1) & (pl.col("round") == row["round"]))
        both = a.join(b, on="agent_id", suffix="_b")
        d = (both["guess"] - both["guess_b"]).to_numpy()
        n = len(d)
        half = stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert row["n_pairs"] == n and 0 < n < N
        assert row["mean_difference"] == pytest.approx(d.mean(), abs=1e-9)
        assert (row["ci95_low"], row["ci95_high"]) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-9)
        assert row["median_difference"] == pytest.approx(float(np.median(d)))
        assert row["wilcoxon_p"] == pytest.approx(stats.wilcoxon(d).pvalue, rel=1e-9)


def test_human_reference_holds_both_papers_with_sources(filled):
    ref = filled.query("SELECT * FROM human_reference")
    nagel = {r["ratio"]: (r["mean"], r["median"]) for r in ref.filter(pl.col("kind") == "result").iter_rows(named=True)}
    assert nagel == {"1/2": (27.05, 17.0), "2/3": (36.73, 33.0), "4/3": (60.12, None)}
    ch = ref.filter(pl.col("kind") == "cognitive hierarchy")
    assert ch.height >= 10 and ch["source"].str.contains("Camerer, Ho & Chong \\(2004\\)").all()
    assert ch["tau"].is_not_null().all() and (ch["tau_low"] <= ch["tau"]).all() and (ch["tau"] <= ch["tau_high"]).all()
    # Each row is a CH fit of its rule: our τ for the pool's mean is the table's τ (which was fitted
    # with the players' own weight in small groups and rounded; the gap grows with τ).
    for row in ch.iter_rows(named=True):
        ours = Hierarchy(GameRule(ratio=row["ratio"], offset=row["offset"])).tau(row["mean"])
        assert abs(ours - row["tau"]) <= 0.1 + 0.1 * row["tau"], (row["pool"], ours, row["tau"])


# ------------------------------------------------------------------ the pure statistics
def test_hierarchy_round_trips_and_refuses_unreachable_means():
    for ratio, offset in [("2/3", 0), ("1/2", 5), ("4/3", 0), ("7/10", 12.6)]:
        h = Hierarchy(GameRule(ratio=ratio, offset=offset))
        for tau in (0.05, 0.5, 1.5, 3.0, 7.0):
            assert h.tau(h.mean(tau)) == pytest.approx(tau, abs=1e-4)
            assert h.mean(tau) == pytest.approx(ch_mean_by_hand(GameRule(ratio=ratio, offset=offset), tau), abs=1e-9)
    h = Hierarchy(GameRule(ratio="2/3"))
    assert h.tau(50.0) == 0.0 and h.tau(50.5) is None and h.tau(50.5, clamp=True) == 0.0
    assert h.tau(0.1) is None and h.tau(0.1, clamp=True) == TAU_MAX


def test_bootstrap_means_match_resampling_agents():
    rng = np.random.default_rng(3)
    for values in (rng.integers(0, 101, 5000).astype(float), np.round(rng.random(5000) * 100, 2)):
        means = bootstrap_means(values, seed=1, resamples=4000)
        assert means.mean() == pytest.approx(values.mean(), abs=0.05)
        assert means.std() == pytest.approx(values.std() / math.sqrt(len(values)), rel=0.05)
        assert np.array_equal(means, bootstrap_means(values, seed=1, resamples=4000))  # seeded


def test_fit_tau_on_a_cognitive_hierarchy_sample():
    rule = GameRule(ratio="2/3", answers="real")
    h = Hierarchy(rule)
    assert fit_tau(np.array([]), h, 0).fit == "no valid guesses"
    above = fit_tau(np.full(100, 70.0), h, 0)
    assert above.fit == "no τ fits" and above.tau is None and above.tau_low is None


def test_paired_test_edge_cases():
    same = paired_test(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0]))
    assert same.mean_difference == 0 and same.wilcoxon_p is None and "same" in same.note
    shift = paired_test(np.array([3.0, 4.0, 5.0]), np.array([1.0, 2.0, 3.0]))
    assert (shift.ci95_low, shift.ci95_high) == (2.0, 2.0) and shift.wilcoxon_p is not None
    assert paired_test(np.array([]), np.array([])).n_pairs == 0
    assert paired_test(np.array([1.0]), np.array([2.0])).ci95_low is None
