"""Behavioural baselines of the simulated engine: uniform, level-k, cognitive hierarchy.

Closed forms are checked against independent implementations written here from the
definitions (Camerer, Ho & Chong 2004), and the engine's sampled agents against them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.game import GameRule
from core.hierarchy import cognitive_hierarchy_choices, cognitive_hierarchy_mean, level_k_choices
from core.seeds import agent_seeds
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec

pytestmark = pytest.mark.quick


def ch_by_hand(ratio: float, offset: float, tau: float, low=0.0, high=100.0, levels=60):
    """Cognitive hierarchy from the definition: Poisson(τ) levels; level 0 uniform on
    [low, high]; level k names clamp(offset + ratio × mean of levels 0..k−1 weighted by
    f_j / Σ_{i<k} f_i). Returns (choices, population mean)."""
    f = [math.exp(-tau) * tau**k / math.factorial(k) for k in range(levels)]
    x = [(low + high) / 2]
    for k in range(1, levels):
        believed = sum(f[j] * x[j] for j in range(k)) / sum(f[:k])
        x.append(min(max(offset + ratio * believed, low), high))
    return x, sum(fk * xk for fk, xk in zip(f, x))


def play(spec: dict, rule: GameRule, n: int, seed: int = 11) -> np.ndarray:
    engine = build_engine(parse_spec(spec))
    ids = np.arange(n, dtype=np.int64)
    seeds = (agent_seeds(seed, ids, "sample", 1) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    batch = RequestBatch(ids, [""] * n, seeds, Sampling(), Constraint(rule.low, rule.high, rule.integer), rule)
    out = engine.generate(batch)
    assert out.error == [None] * n
    return np.array([float(t) for t in out.text])


def test_level_k_choices_for_two_thirds():
    x = level_k_choices(GameRule(ratio="2/3"), 5)
    assert x == pytest.approx([50, 100 / 3, 200 / 9, 400 / 27, 800 / 81, 1600 / 243])
    assert np.round(x[:4], 2).tolist() == [50.0, 33.33, 22.22, 14.81]


def test_level_k_choices_for_five_plus_half():
    # 50 → 5 + 25 = 30 → 20 → 15 → 12.5: converging to the equilibrium 10
    x = level_k_choices(GameRule(ratio="1/2", offset=5), 30)
    assert x[:5].tolist() == [50, 30, 20, 15, 12.5]
    assert x[-1] == pytest.approx(GameRule(ratio="1/2", offset=5).equilibrium, abs=1e-6)


@pytest.mark.parametrize("ratio, offset", [(2 / 3, 0), (1 / 2, 0), (51 / 100, 0), (1 / 2, 5)])
def test_cognitive_hierarchy_matches_the_formula(ratio, offset):
    from fractions import Fraction

    rule = GameRule(ratio=str(Fraction(ratio).limit_denominator(100)), offset=offset)
    x, mean = ch_by_hand(ratio, offset, 1.5)
    ours = cognitive_hierarchy_choices(rule, 1.5)
    assert ours == pytest.approx(x[: len(ours)], abs=1e-9)
    assert cognitive_hierarchy_mean(rule, 1.5) == pytest.approx(mean, abs=1e-9)


def test_cognitive_hierarchy_mean_two_thirds_tau_1_5():
    _, mean = ch_by_hand(2 / 3, 0, 1.5)
    assert cognitive_hierarchy_mean(GameRule(ratio="2/3"), 1.5) == pytest.approx(mean, abs=1e-9)
    # Levels 1 and 2 by hand: 2/3 × 50; 2/3 × (f0·50 + f1·33.3)/(f0 + f1) with f1/f0 = τ
    x = cognitive_hierarchy_choices(GameRule(ratio="2/3"), 1.5, 2)
    assert x[1] == pytest.approx(100 / 3)
    assert x[2] == pytest.approx(2 / 3 * (50 + 1.5 * 100 / 3) / 2.5)


def test_level_k_engine_fixed_level():
    rule = GameRule(ratio="2/3", answers="real")
    assert set(play({"kind": "simulated", "rule": "level_k", "k": 2}, rule, 50)) == {22.22}
    # integer games round to the nearest integer
    assert set(play({"kind": "simulated", "rule": "level_k", "k": 1}, GameRule(ratio="2/3"), 50)) == {33}
    assert set(play({"kind": "simulated", "rule": "level_k", "k": 3}, GameRule(ratio="1/2", offset=5), 50)) == {15}


def test_level_k_engine_levels_drawn_from_a_distribution():
    rule = GameRule(ratio="2/3")
    values = play({"kind": "simulated", "rule": "level_k", "k": {1: 0.5, 2: 0.5}}, rule, 4000)
    assert set(values) == {33, 22}
    assert (values == 33).mean() == pytest.approx(0.5, abs=0.03)


def test_level_zero_is_the_uniform_dummy_agent():
    rule = GameRule(ratio="2/3")
    uniform = play({"kind": "simulated", "rule": "uniform"}, rule, 2000)
    level0 = play({"kind": "simulated", "rule": "level_k", "k": 0}, rule, 2000)
    assert np.array_equal(uniform, level0)  # same seeds → same draws (paired arms)
    assert uniform.min() >= 0 and uniform.max() <= 100 and uniform.mean() == pytest.approx(50, abs=2)


def test_cognitive_hierarchy_population_sampled_per_agent():
    rule = GameRule(ratio="2/3", answers="real")
    n = 40_000
    values = play({"kind": "simulated", "rule": "cognitive_hierarchy", "tau": 1.5}, rule, n)
    x, mean = ch_by_hand(2 / 3, 0, 1.5)
    # Agents of level ≥ 1 name their level's choice (two decimals): level frequencies are Poisson(1.5).
    for k in (1, 2, 3):
        share = (values == round(x[k], 2)).mean()
        assert share == pytest.approx(math.exp(-1.5) * 1.5**k / math.factorial(k), abs=0.01)
    # The sample mean estimates the population mean (level-0 spread: SE ≈ 0.08 here).
    assert values.mean() == pytest.approx(mean, abs=0.4)
    assert values.min() >= 0 and values.max() <= 100


def test_noise_is_gaussian_and_clipped():
    rule = GameRule(ratio="2/3", answers="real")
    plain = play({"kind": "simulated", "rule": "level_k", "k": 1}, rule, 5000)
    noisy = play({"kind": "simulated", "rule": "level_k", "k": 1, "noise": 5}, rule, 5000)
    assert set(plain) == {33.33}
    assert noisy.std() == pytest.approx(5, rel=0.05) and noisy.mean() == pytest.approx(33.33, abs=0.3)
    wide = play({"kind": "simulated", "rule": "level_k", "k": 1, "noise": 80}, GameRule(ratio="2/3"), 2000)
    assert wide.min() == 0 and wide.max() == 100 and np.all(wide == np.round(wide))


def test_baselines_are_labelled_simulated_never_llm():
    assert parse_spec({"kind": "simulated", "rule": "cognitive_hierarchy"}).model_name == "simulated/cognitive_hierarchy(tau=1.5)"
    assert parse_spec({"kind": "simulated", "rule": "level_k", "k": 2}).model_name == "simulated/level_k(k=2)"
    assert parse_spec({"kind": "simulated"}).model_name == "simulated/uniform"


def test_behavioural_rules_need_the_game_rule():
    engine = build_engine(parse_spec({"kind": "simulated", "rule": "level_k"}))
    batch = RequestBatch(np.arange(2), ["", ""], np.arange(2), Sampling(), Constraint(0, 100, True), None)
    with pytest.raises(ValueError, match="needs the game rule"):
        engine.generate(batch)


def test_bad_level_distribution_is_refused():
    with pytest.raises(ValueError, match="non-negative"):
        parse_spec({"kind": "simulated", "rule": "level_k", "k": {1: -1}})
