"""Expected versus sampled shares: how closely a sample follows its spec.

Expected shares come from the spec alone (conditional attributes are marginalised over
their parent; numeric bands integrate the distribution), so the comparison is honest
for both sampling modes.
"""

from __future__ import annotations

import math

import polars as pl

from populations.sampler import normal_cdf
from populations.spec import Categorical, Conditional, Numeric, PopulationSpec


def expected_shares(spec: PopulationSpec) -> dict[str, dict[str, float]]:
    """Column → (value → expected share) for every categorical column and every band column."""
    out: dict[str, dict[str, float]] = {}
    for name, attribute in spec.attributes.items():
        if isinstance(attribute, Categorical):
            out[name] = dict(attribute.shares)
        elif isinstance(attribute, Conditional):
            parent = out[attribute.given]
            marginal = dict.fromkeys(attribute.labels, 0.0)
            for value, p in parent.items():
                for label, share in attribute.shares[value].items():
                    marginal[label] += p * share
            out[name] = marginal
        elif attribute.bands:
            out[f"{name}_band"] = _band_shares(attribute)
    return out


def _band_shares(a: Numeric) -> dict[str, float]:
    # Rounded distributions store k for draws in [k - 0.5, k + 0.5): shift the edges.
    shift = 0.5 if a.integer and a.distribution != "histogram" else 0.0
    edges = [-math.inf, *[b - shift for b in a.bands], math.inf]
    cdf = [numeric_cdf(a, e) for e in edges]
    return {label: cdf[i + 1] - cdf[i] for i, label in enumerate(a.band_labels)}


def numeric_cdf(a: Numeric, x: float) -> float:
    """P(draw ≤ x) for a numeric attribute's distribution (before rounding)."""
    if a.distribution == "uniform":
        return min(max((x - a.low) / (a.high - a.low), 0.0), 1.0)
    if a.distribution == "normal":
        return normal_cdf(x, a.mean, a.sd)
    if a.distribution == "truncnormal":
        lo, hi = normal_cdf(a.low, a.mean, a.sd), normal_cdf(a.high, a.mean, a.sd)
        return min(max((normal_cdf(x, a.mean, a.sd) - lo) / (hi - lo), 0.0), 1.0)
    total = 0.0
    for left, right, share in zip(a.edges, a.edges[1:], a.shares):
        total += share * min(max((x - left) / (right - left), 0.0), 1.0)
    return total


def share_report(spec: PopulationSpec, personas: pl.DataFrame) -> pl.DataFrame:
    """One row per (attribute, value): expected share, sampled share and count.

    Numeric attributes also get a ``mean`` row (sampled mean; expected where the
    distribution is not rounded).
    """
    n = personas.height
    rows: list[dict[str, object]] = []
    for column, expected in expected_shares(spec).items():
        counts = dict(personas.group_by(column).len().iter_rows())
        for value, share in expected.items():
            count = counts.get(value, 0)
            if share == 0 and count == 0:  # e.g. the "<18" band of an adult population
                continue
            rows.append({"attribute": column, "value": value, "expected": share, "sampled": count / n, "count": count})
    for name, attribute in spec.attributes.items():
        if isinstance(attribute, Numeric):
            rows.append({"attribute": name, "value": "mean", "expected": _mean(attribute), "sampled": float(personas[name].mean()), "count": n})
    return pl.DataFrame(rows, schema={"attribute": pl.String, "value": pl.String, "expected": pl.Float64, "sampled": pl.Float64, "count": pl.Int64})


def _mean(a: Numeric) -> float | None:
    if a.distribution == "uniform" and not a.integer:
        return (a.low + a.high) / 2
    if a.distribution == "normal" and not a.integer:
        return a.mean
    if a.distribution == "truncnormal" and not a.integer:
        alpha, beta = (a.low - a.mean) / a.sd, (a.high - a.mean) / a.sd
        pdf = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
        z = normal_cdf(beta, 0, 1) - normal_cdf(alpha, 0, 1)
        return a.mean + a.sd * (pdf(alpha) - pdf(beta)) / z
    if a.distribution == "histogram":
        # floor() of a uniform draw in [l, r) with integer edges has mean (l + r - 1) / 2
        offset = 0.5 if a.integer else 0.0
        return sum(s * ((l + r) / 2 - offset) for l, r, s in zip(a.edges, a.edges[1:], a.shares))
    return None
