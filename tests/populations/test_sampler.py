"""The sampler: exact quotas, reproducible draws, numeric and conditional attributes, names."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from core.quotas import quota_counts
from populations.names import locale_names
from populations.sampler import sample
from populations.spec import load_spec, parse_spec
from populations.summary import expected_shares, share_report

pytestmark = pytest.mark.quick

ADULTS = load_spec("adults.yaml")


def test_education_quota_gives_exactly_200_per_level():
    frame = sample(load_spec("education.yaml"), 1000, seed=0)
    assert frame.height == 1000 and frame["agent_id"].to_list() == list(range(1000))
    counts = dict(frame.group_by("education").len().iter_rows())
    assert counts == {level: 200 for level in load_spec("education.yaml").attributes["education"].shares}


def test_quota_counts_use_largest_remainders():
    assert quota_counts([1 / 3] * 3, 100).tolist() == [34, 33, 33]
    assert quota_counts([0.125, 0.375, 0.5], 10).tolist() == [1, 4, 5]  # 1.25, 3.75, 5.0
    assert quota_counts({"a": 0.6, "b": 0.4}, 7).tolist() == [4, 3]  # 4.2, 2.8: the one left over goes to b
    for n in (1, 7, 999, 10_001):
        assert quota_counts(np.full(7, 1 / 7), n).sum() == n


def test_same_seed_same_personas_other_seed_differs():
    a = sample(ADULTS, 2000, seed=11)
    b = sample(ADULTS, 2000, seed=11)
    c = sample(ADULTS, 2000, seed=12)
    assert a.equals(b)
    assert not a.equals(c)
    # quota: a different seed changes who gets what, never the counts
    assert a["education"].value_counts(sort=True).equals(c["education"].value_counts(sort=True))


def test_adding_an_attribute_leaves_the_others_draws_unchanged():
    base = parse_spec({"attributes": {"education": {"A": 0.3, "B": 0.7}}})
    more = parse_spec({"attributes": {"education": {"A": 0.3, "B": 0.7}, "mood": {"calm": 0.5, "bold": 0.5}}})
    assert sample(base, 500, 3)["education"].equals(sample(more, 500, 3)["education"])


def test_conditional_quota_is_exact_within_each_parent_group():
    frame = sample(ADULTS, 10_000, seed=5)
    table = ADULTS.attributes["occupation"].shares
    for (education,), group in frame.group_by(["education"]):
        counts = dict(group.group_by("occupation").len().iter_rows())
        expected = quota_counts(table[education], group.height)
        assert [counts.get(k, 0) for k in table[education]] == expected.tolist(), education


def test_iid_draws_are_independent_but_close_to_the_shares():
    spec = parse_spec({"sampling": "iid", "attributes": {"education": {"A": 0.2, "B": 0.3, "C": 0.5}}})
    frame = sample(spec, 20_000, seed=1)
    shares = {k: v / 20_000 for k, v in frame.group_by("education").len().iter_rows()}
    assert shares == pytest.approx({"A": 0.2, "B": 0.3, "C": 0.5}, abs=0.015)
    counts = sorted(frame.group_by("education").len()["len"].to_list())
    assert counts != [4000, 6000, 10000]  # not quota


def test_histogram_quota_fills_bins_exactly_and_bands_follow_the_numbers():
    frame = sample(ADULTS, 1000, seed=2)
    age = ADULTS.attributes["age"]
    assert frame.schema["age"] == pl.Int64
    assert frame["age"].min() >= 18 and frame["age"].max() < 90
    bins = np.searchsorted(np.array(age.edges), frame["age"].to_numpy(), side="right") - 1
    assert np.bincount(bins, minlength=7).tolist() == quota_counts(age.shares, 1000).tolist()
    # every band label matches the stored age, recomputed by hand
    for value, band in frame.select("age", "age_band").iter_rows():
        low = max(b for b in age.bands if b <= value)
        following = [b for b in age.bands if b > value]
        assert band == (f"{low:g}-{following[0] - 1:g}" if following else f"{low:g}+")


def test_truncated_normal_stays_within_bounds_with_the_right_mean():
    spec = parse_spec({"attributes": {"risk": {"distribution": "truncnormal", "mean": 0.2, "sd": 1.0, "low": 0, "high": 1}}})
    frame = sample(spec, 50_000, seed=4)
    assert frame["risk"].min() >= 0 and frame["risk"].max() <= 1
    expected = share_report(spec, frame).filter(pl.col("value") == "mean")["expected"][0]
    assert frame["risk"].mean() == pytest.approx(expected, abs=0.005)
    # by hand: 0.2 + (φ(-0.2) - φ(0.8)) / (Φ(0.8) - Φ(-0.2)) = 0.2 + (0.39104 - 0.28969) / 0.36740
    assert expected == pytest.approx(0.4759, abs=1e-3)


def test_normal_integer_attribute_is_rounded_and_banded_as_expected():
    spec = parse_spec({"attributes": {"age": {"distribution": "normal", "mean": 40, "sd": 12, "integer": True, "bands": [30, 50]}}})
    frame = sample(spec, 40_000, seed=9)
    assert frame.schema["age"] == pl.Int64
    report = share_report(spec, frame).filter(pl.col("attribute") == "age_band")
    for row in report.iter_rows(named=True):
        assert row["sampled"] == pytest.approx(row["expected"], abs=0.01), row


def test_names_come_from_the_locale_lists_and_follow_gender():
    frame = sample(ADULTS, 3000, seed=1)
    lists = locale_names("en_US")
    female = set(lists["female"].names.to_list())
    male = set(lists["male"].names.to_list())
    last = set(lists["last"].names.to_list())
    first = frame["name"].str.split(" ").list.first()
    assert frame["name"].str.split(" ").list.last().is_in(list(last)).all()
    assert first.filter(frame["gender"] == "Female").is_in(list(female)).all()
    assert first.filter(frame["gender"] == "Male").is_in(list(male)).all()
    assert frame["name"].n_unique() > 2500  # individual, not a handful of names


def test_other_locales_and_unknown_locale():
    spec = parse_spec({"names": {"locale": "de_DE"}, "attributes": {}})
    names = sample(spec, 200, seed=0)["name"].to_list()
    lists = locale_names("de_DE")
    first, last = set(lists["any"].names.to_list()), set(lists["last"].names.to_list())
    # German names may hold spaces ("Hans Dieter", "van der Linde"): try every split
    def known(name: str) -> bool:
        parts = name.split(" ")
        return any(" ".join(parts[:i]) in first and " ".join(parts[i:]) in last for i in range(1, len(parts)))

    assert all(known(name) for name in names), [n for n in names if not known(n)]
    with pytest.raises(ValueError, match="unknown locale 'xx_YY'"):
        sample(parse_spec({"names": {"locale": "xx_YY"}}), 5, seed=0)


def test_expected_marginals_of_a_conditional_attribute():
    expected = expected_shares(ADULTS)["occupation"]
    education = ADULTS.attributes["education"].shares
    table = ADULTS.attributes["occupation"].shares
    assert expected["Professional"] == pytest.approx(sum(education[e] * table[e]["Professional"] for e in education))
    assert sum(expected.values()) == pytest.approx(1.0)


def test_size_must_be_positive():
    with pytest.raises(ValueError, match="population size must be positive, got 0"):
        sample(ADULTS, 0, seed=0)
