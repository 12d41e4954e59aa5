"""Spec validation: every bad spec fails with one line naming the attribute and value."""

from __future__ import annotations

import pytest

from populations.spec import Categorical, Conditional, Numeric, SpecError, load_spec, parse_spec

pytestmark = pytest.mark.quick

EDUCATION = {"High School": 0.5, "Ph.D.": 0.5}


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"education": {"A": 0.5, "B": 0.7}}, "population.attributes.education.shares: shares sum to 1.2, expected 1.0"),
        ({"education": {"A": 0.5, "B": -0.1, "C": 0.6}}, "population.attributes.education.shares: share -0.1 is negative"),
        (
            {"education": EDUCATION, "occupation": {"given": "education", "shares": {"High School": {"Clerk": 1}, "Doctorate": {"Clerk": 1}}}},
            "population.attributes.occupation.shares.Doctorate: unknown value of parent 'education'; known: High School, Ph.D.",
        ),
        (
            {"education": EDUCATION, "occupation": {"given": "education", "shares": {"High School": {"Clerk": 1}, "Ph.D.": {"Clerk": 0.9}}}},
            "population.attributes.occupation.shares.Ph.D.: shares sum to 0.9, expected 1.0",
        ),
        (
            {"education": EDUCATION, "occupation": {"given": "education", "shares": {"High School": {"Clerk": 1}}}},
            "population.attributes.occupation.shares: no share table for education = 'Ph.D.'",
        ),
        (
            {"occupation": {"given": "education", "shares": {"High School": {"Clerk": 1}}}, "education": EDUCATION},
            "population.attributes.occupation.given: 'education' must be declared before it",
        ),
        ({"age": {"distribution": "poisson", "mean": 3}}, "population.attributes.age.distribution: unknown distribution 'poisson'; available: histogram, normal, truncnormal, uniform"),
        ({"age": {"distribution": "normal", "mean": 40}}, "population.attributes.age: distribution 'normal' needs sd"),
        ({"age": {"distribution": "uniform", "low": 60, "high": 18}}, "population.attributes.age: low (60) must be below high (18)"),
        ({"age": {"distribution": "histogram", "edges": [18, 30, 90], "shares": [0.5, 0.6]}}, "population.attributes.age: histogram shares sum to 1.1, expected 1.0"),
        ({"age": {"distribution": "histogram", "edges": [18, 90], "shares": [0.5, 0.5]}}, "population.attributes.age: a histogram needs one more edge than shares, got 2 edges and 2 shares"),
        ({"age": {"distribution": "normal", "mean": 40, "sd": 10, "bands": [30, 20]}}, "population.attributes.age: bands must be increasing edges, got [30.0, 20.0]"),
        ({"age": {"distribution": "normal", "mean": 40, "sd": 10, "spread": 2}}, "population.attributes.age.spread: unknown key"),
        ({"name": {"A": 1}}, "population.attributes.name: reserved column name"),
    ],
)
def test_bad_specs_fail_with_one_line_naming_the_attribute(attributes, message):
    with pytest.raises(SpecError) as info:
        parse_spec({"attributes": attributes})
    assert str(info.value) == message


def test_attribute_kinds_are_recognised_from_their_keys():
    spec = parse_spec(
        {
            "attributes": {
                "age": {"distribution": "uniform", "low": 18, "high": 65},
                "education": EDUCATION,
                "field": {"given": "education", "shares": {"High School": {"Trade": 1}, "Ph.D.": {"Science": "1/2", "Arts": "1/2"}}},
            }
        }
    )
    kinds = {name: type(a) for name, a in spec.attributes.items()}
    assert kinds == {"age": Numeric, "education": Categorical, "field": Conditional}
    assert spec.attributes["field"].shares["Ph.D."] == {"Science": 0.5, "Arts": 0.5}


def test_fraction_shares_are_exact():
    spec = load_spec("occupation.yaml")
    assert sum(spec.attributes["occupation"].shares.values()) == pytest.approx(1.0, abs=1e-12)


def test_shipped_specs_load_and_name_their_source():
    for name in ("education.yaml", "occupation.yaml", "adults.yaml"):
        spec = load_spec(name)
        assert spec.source, name
    assert list(load_spec("education.yaml").attributes["education"].shares) == [
        "Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."
    ]
    assert list(load_spec("occupation.yaml").attributes["occupation"].shares) == [
        "Professor of Game Theory", "Economist", "Psychologist", "Athlete", "Artist", "Writer"
    ]
    adults = load_spec("adults.yaml")
    assert list(adults.attributes) == ["age", "gender", "education", "occupation"]
    assert adults.attributes["occupation"].given == "education"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml: no such population spec"):
        load_spec("nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("attributes: [unclosed\n")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_spec(bad)


def test_band_labels():
    age = Numeric(distribution="uniform", low=0, high=100, integer=True, bands=[18, 25, 65])
    assert age.band_labels == ["<18", "18-24", "25-64", "65+"]
    score = Numeric(distribution="uniform", low=0, high=1, bands=[0.5])
    assert score.band_labels == ["<0.5", "0.5+"]
