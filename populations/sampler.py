"""Sample personas from a population spec: vectorised, seeded, reproducible.

Every attribute draws from its own random stream, derived from (seed, attribute name),
so adding an attribute to a spec leaves the others' draws unchanged. Categories are
drawn as integer codes (numpy) and become strings once, at the end (polars gather).
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import polars as pl

from core.quotas import quota_counts
from populations.names import draw_names
from populations.spec import Categorical, Conditional, Numeric, PopulationSpec


def attribute_rng(seed: int, attribute: str) -> np.random.Generator:
    """The random stream of one attribute: a pure function of (seed, attribute name)."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(attribute.encode())]))


def sample(spec: PopulationSpec, n: int, seed: int) -> pl.DataFrame:
    """Draw ``n`` personas. Same spec, seed and n → the same personas.

    Args:
        spec: the population spec.
        n: the number of personas (positive).
        seed: the seed every draw derives from.

    Returns:
        A frame with ``agent_id`` (0..n-1), one column per attribute (numbers for
        numeric attributes, strings otherwise), ``<name>_band`` for banded numeric
        attributes, and ``name`` when the spec asks for names.

    Raises:
        ValueError: ``n`` is not positive.
    """
    if n <= 0:
        raise ValueError(f"population size must be positive, got {n}")
    codes: dict[str, tuple[list[str], np.ndarray]] = {}  # categorical column → (labels, codes)
    numbers: dict[str, np.ndarray] = {}
    order: list[str] = []
    for name, attribute in spec.attributes.items():
        rng = attribute_rng(seed, name)
        if isinstance(attribute, Categorical):
            p = np.array(list(attribute.shares.values()))
            codes[name] = (attribute.labels, _draw(p, n, spec.sampling, rng))
            order.append(name)
        elif isinstance(attribute, Conditional):
            codes[name] = _conditional(attribute, codes[attribute.given], n, spec.sampling, rng)
            order.append(name)
        else:
            numbers[name] = _numeric(attribute, n, spec.sampling, rng)
            order.append(name)
            if attribute.bands:
                band = np.searchsorted(np.asarray(attribute.bands), numbers[name], side="right")
                codes[f"{name}_band"] = (attribute.band_labels, band)
                order.append(f"{name}_band")
    columns: list[pl.Series] = [pl.Series("agent_id", np.arange(n, dtype=np.int64))]
    for column in order:
        if column in numbers:
            columns.append(pl.Series(column, numbers[column]))
        else:
            labels, c = codes[column]
            columns.append(_labels(column, labels, c))
    if spec.names is not None:
        gender = None
        if spec.names.gender:
            labels, c = codes[spec.names.gender]
            gender = (labels, c)
        columns.append(draw_names(n, spec.names.locale, attribute_rng(seed, "name"), gender))
    return pl.DataFrame(columns)


def _labels(name: str, labels: list[str], codes: np.ndarray) -> pl.Series:
    return pl.Series(name, labels, dtype=pl.String).gather(codes)


def _draw(p: np.ndarray, n: int, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Category codes for ``n`` personas with shares ``p``."""
    # The smallest code type: shuffling bytes is about twice as fast as shuffling words.
    dtype = np.uint8 if len(p) <= 256 else np.uint32
    if mode == "quota":
        out = np.repeat(np.arange(len(p), dtype=dtype), quota_counts(p, n))
        rng.shuffle(out)
        return out
    cumulative = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cumulative, rng.random(n), side="right"), len(p) - 1).astype(dtype)


def _conditional(
    attribute: Conditional, parent: tuple[list[str], np.ndarray], n: int, mode: str, rng: np.random.Generator
) -> tuple[list[str], np.ndarray]:
    """Draw within each parent group (quota: exact counts per group)."""
    parent_labels, parent_codes = parent
    labels = attribute.labels
    index = {label: i for i, label in enumerate(labels)}
    out = np.empty(n, dtype=np.uint8 if len(labels) <= 256 else np.uint32)
    for code, value in enumerate(parent_labels):
        members = np.flatnonzero(parent_codes == code)
        if not len(members):
            continue
        table = attribute.shares[value]
        p = np.zeros(len(labels))
        for label, share in table.items():
            p[index[label]] = share
        out[members] = _draw(p, len(members), mode, rng)
    return labels, out


def _numeric(attribute: Numeric, n: int, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Numbers from the attribute's distribution (histograms honour quota per bin)."""
    a = attribute
    if a.distribution == "histogram":
        edges = np.asarray(a.edges, dtype=np.float64)
        bins = _draw(np.asarray(a.shares), n, mode, rng)
        values = edges[bins] + rng.random(n) * (edges[bins + 1] - edges[bins])
        return np.floor(values).astype(np.int64) if a.integer else values
    if a.distribution == "uniform":
        values = rng.uniform(a.low, a.high, n)
    elif a.distribution == "normal":
        values = rng.normal(a.mean, a.sd, n)
    else:
        values = _truncated_normal(a.mean, a.sd, a.low, a.high, n, rng)
    if a.integer:
        values = np.rint(values)
        if a.low is not None:
            # rounding may step just outside a bound: stay within it
            values = np.clip(values, math.ceil(a.low), math.floor(a.high))
        return values.astype(np.int64)
    return values


def _truncated_normal(mean: float, sd: float, low: float, high: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Normal draws restricted to [low, high], by vectorised rejection."""
    accept = normal_cdf(high, mean, sd) - normal_cdf(low, mean, sd)
    if accept < 1e-4:
        raise ValueError(f"truncnormal: [{low:g}, {high:g}] holds only {accept:.2g} of N({mean:g}, {sd:g}); widen the bounds")
    out = np.empty(n)
    filled = 0
    while filled < n:
        want = int((n - filled) / accept * 1.1) + 16
        draws = rng.normal(mean, sd, want)
        draws = draws[(draws >= low) & (draws <= high)][: n - filled]
        out[filled : filled + len(draws)] = draws
        filled += len(draws)
    return out


def normal_cdf(x: float, mean: float, sd: float) -> float:
    """P(X ≤ x) for X ~ N(mean, sd²)."""
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    return 0.5 * (1.0 + math.erf((x - mean) / (sd * math.sqrt(2.0))))
