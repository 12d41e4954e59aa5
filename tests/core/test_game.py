"""Game rules and round outcomes, checked against independent exact computations."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from core.game import GameOverride, GameRule, Groups, group_outcomes, outcome

pytestmark = pytest.mark.quick

RULES = {
    "2/3": GameRule(ratio="2/3"),
    "1/2": GameRule(ratio="1/2"),
    "51/100": GameRule(ratio="51/100"),
    "5 + 1/2": GameRule(ratio="1/2", offset=5),
}


def exact_outcome(guesses: list[int | None], ratio: Fraction, offset: Fraction, low=0, high=100, tolerance=Fraction(0)):
    """The outcome by hand, in exact fractions: mean, target, winners."""
    valid = [(i, Fraction(g)) for i, g in enumerate(guesses) if g is not None]
    mean = sum(g for _, g in valid) / len(valid)
    target = min(max(ratio * mean + offset, Fraction(low)), Fraction(high))
    nearest = min(abs(g - target) for _, g in valid)
    band = max(nearest, tolerance)
    winners = sorted(i for i, g in valid if abs(g - target) <= band)
    return mean, target, winners


def frame(guesses: list[int | None]) -> pl.DataFrame:
    return pl.DataFrame(
        {"agent_id": range(len(guesses)), "guess": [None if g is None else float(g) for g in guesses],
         "valid": [g is not None for g in guesses]},
        schema={"agent_id": pl.Int64, "guess": pl.Float64, "valid": pl.Boolean},
    )


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_target_and_winners_match_exact_arithmetic(name, seed):
    rule = RULES[name]
    rng = np.random.default_rng(seed)
    guesses: list[int | None] = [int(x) for x in rng.integers(0, 101, 301)]
    for i in rng.choice(301, 20, replace=False):
        guesses[i] = None  # invalid answers take no part in the mean
    mean, target, winners = exact_outcome(guesses, Fraction(rule.ratio), Fraction(rule.offset))
    result = outcome(frame(guesses), rule)
    assert result.n == 301 and result.n_valid == 281
    assert result.mean == pytest.approx(float(mean), abs=1e-9)
    assert result.target == pytest.approx(float(target), abs=1e-9)
    assert result.winners.tolist() == winners
    assert result.n_winners == len(winners) >= 1


def test_target_always_includes_the_offset():
    guesses = [10, 20, 30]  # mean 20
    assert outcome(frame(guesses), RULES["5 + 1/2"]).target == 15
    assert outcome(frame(guesses), RULES["1/2"]).target == 10


def test_tolerance_band_lets_near_guesses_win_too():
    rule = GameRule(ratio="1/2", tolerance=0.5)
    guesses = [20, 21, 22, 19, 0, 100, 78]  # mean 260/7, target 130/7 ≈ 18.57
    mean, target, winners = exact_outcome(guesses, Fraction(1, 2), Fraction(0), tolerance=Fraction(1, 2))
    result = outcome(frame(guesses), rule)
    assert result.target == pytest.approx(float(target))
    assert result.winners.tolist() == winners == [3]  # 19 is 0.43 away, 20 is 1.43 away
    wide = outcome(frame(guesses), GameRule(ratio="1/2", tolerance=1.5))
    assert wide.winners.tolist() == [0, 3]
    assert wide.winning_guess == 19


def test_ties_all_win_and_the_smaller_winning_guess_is_reported():
    result = outcome(frame([0, 100, 50, 50]), GameRule(ratio="2/3"))  # mean 50, target 33.33…
    assert result.winners.tolist() == [2, 3] and result.winning_guess == 50
    # 10 and 30 are both 10 from the target 20 (mean 30 × 2/3)
    result = outcome(frame([10, 30, 50, 30, 30]), GameRule(ratio="2/3"))
    assert result.target == pytest.approx(20) and result.winners.tolist() == [0, 1, 3, 4]
    assert result.winning_guess == 10


def test_target_is_clamped_to_the_bounds():
    assert outcome(frame([90, 100]), GameRule(ratio="3/2")).target == 100
    assert outcome(frame([0, 2]), GameRule(ratio="1/2", low=5, high=100)).target == 5


def test_a_round_with_no_valid_guess_has_no_target():
    result = outcome(frame([None, None]), GameRule())
    assert result.n == 2 and result.n_valid == 0 and result.target is None and result.n_winners == 0


@pytest.mark.parametrize(
    "rule, expected",
    [
        (GameRule(ratio="2/3"), 0.0),
        (GameRule(ratio="1/2"), 0.0),
        (GameRule(ratio="51/100"), 0.0),
        (GameRule(ratio="1/2", offset=5), 10.0),  # the paper's "5 + 1/2 of the average"
        (GameRule(ratio="2/3", offset=5), 15.0),
        (GameRule(ratio="1/2", offset=60), 100.0),  # 120, clamped to high
        (GameRule(ratio="2/3", low=10), 10.0),  # 0, clamped to low
        (GameRule(ratio="1"), 100.0),
        (GameRule(ratio="4/3"), 100.0),
        (GameRule(ratio="3/2", offset=5, high=50), 50.0),
    ],
)
def test_equilibrium(rule, expected):
    assert rule.equilibrium == pytest.approx(expected, abs=1e-12)
    # It is a fixed point of the best response, and for ratio < 1 an attracting one.
    assert rule.target(rule.equilibrium) == pytest.approx(rule.equilibrium, abs=1e-12)
    if rule.fraction < 1:
        x = 73.0
        for _ in range(200):
            x = rule.target(x)
        assert x == pytest.approx(expected, abs=1e-9)


def test_ratio_is_exact_and_described():
    assert GameRule(ratio=0.51).ratio == "51/100"
    assert GameRule(ratio="0.5").fraction == Fraction(1, 2)
    assert GameRule(ratio="1/2", offset=5).describe() == "5 + 1/2 of the average"
    assert GameRule(ratio="2/3").describe() == "2/3 of the average"
    with pytest.raises(ValueError, match="is not a fraction"):
        GameRule(ratio="2/0")


def test_game_override_changes_only_its_fields():
    base = GameRule(ratio="2/3", rounds=5, tolerance=0.5)
    rule = GameOverride(ratio="1/2", offset=5).apply(base)
    assert (rule.ratio, rule.offset, rule.rounds, rule.tolerance) == ("1/2", 5, 5, 0.5)
    with pytest.raises(ValueError, match="must be above low"):
        GameOverride(high=-1).apply(base)


# ---------------------------------------------------------------------------- groups
def test_each_group_target_comes_from_its_own_members_only():
    rng = np.random.default_rng(5)
    n = 400
    guesses = frame([int(x) for x in rng.integers(0, 101, n)])
    labels = rng.choice(["A", "B", "C"], n)
    # Skew one group so that a global target would differ from its own.
    values = guesses["guess"].to_numpy().copy()
    values[labels == "C"] = np.minimum(values[labels == "C"], 20)
    guesses = guesses.with_columns(guess=pl.Series(values))
    groups = pl.DataFrame({"agent_id": range(n), "group": labels})
    rule = GameRule(ratio="2/3", offset=1)
    result = group_outcomes(guesses, groups, rule)
    assert list(result) == ["A", "B", "C"]
    for name, got in result.items():
        members = [int(v) if l == name else None for v, l in zip(values, labels)]
        mean, target, winners = exact_outcome(members, Fraction(2, 3), Fraction(1))
        assert got.n == int((labels == name).sum())
        assert got.target == pytest.approx(float(target), abs=1e-9)
        assert got.winners.tolist() == winners  # agent ids, from this group only
    assert result["C"].target != pytest.approx(outcome(guesses, rule).target)


def test_rooms_are_balanced_random_and_seeded():
    personas = pl.DataFrame({"agent_id": np.arange(103)})
    rooms = Groups(rooms=4).assign(personas, seed=1)
    sizes = sorted(rooms.value_counts()["count"].to_list())
    assert sizes == [25, 26, 26, 26]
    assert rooms.equals(Groups(rooms=4).assign(personas, seed=1))
    assert not rooms.equals(Groups(rooms=4).assign(personas, seed=2))
    # not simply agent_id modulo k
    assert (rooms != pl.Series([f"room {i % 4 + 1}" for i in range(103)])).any()
    # independent of the order personas come in (sharding)
    shuffled = personas.sample(fraction=1.0, shuffle=True, seed=0)
    again = pl.DataFrame({"agent_id": shuffled["agent_id"], "group": Groups(rooms=4).assign(shuffled, seed=1)}).sort("agent_id")
    assert again["group"].equals(rooms)


def test_groups_by_attribute_and_validation():
    personas = pl.DataFrame({"agent_id": [0, 1, 2], "education": ["PhD", "High School", "PhD"]})
    assert Groups(by="education").assign(personas, 0).to_list() == ["PhD", "High School", "PhD"]
    with pytest.raises(ValueError, match="exactly one"):
        Groups()
    with pytest.raises(ValueError, match="exactly one"):
        Groups(by="education", rooms=2)
