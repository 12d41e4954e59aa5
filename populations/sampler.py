"""Sample personas from a population spec: vectorised, seeded, reproducible."""

from __future__ import annotations

import numpy as np
import polars as pl

from populations.spec import Categorical, PopulationSpec


def quota_counts(shares: dict[str, float], n: int) -> dict[str, int]:
    """Exact counts per category: floor(share × n), the remainder to the largest fractions."""
    raw = {k: v * n for k, v in shares.items()}
    counts = {k: int(np.floor(v)) for k, v in raw.items()}
    left = n - sum(counts.values())
    order = sorted(raw, key=lambda k: (-(raw[k] - counts[k]), list(shares).index(k)))
    for k in order[:left]:
        counts[k] += 1
    return counts


def sample(spec: PopulationSpec, n: int, seed: int) -> pl.DataFrame:
    """Draw ``n`` personas. Same spec, seed and n → the same personas.

    Returns a frame with ``agent_id`` (0..n-1) and one column per attribute.
    """
    if n <= 0:
        raise ValueError(f"population size must be positive, got {n}")
    rng = np.random.default_rng(seed)
    columns: dict[str, object] = {"agent_id": np.arange(n, dtype=np.int64)}
    for name, attribute in spec.attributes.items():
        if isinstance(attribute, Categorical):
            columns[name] = _categorical(attribute, n, spec.sampling, rng)
    frame = pl.DataFrame(columns)
    return frame


def _categorical(attribute: Categorical, n: int, mode: str, rng: np.random.Generator) -> pl.Series:
    labels = list(attribute.shares)
    if mode == "quota":
        counts = quota_counts(attribute.shares, n)
        codes = np.repeat(np.arange(len(labels)), [counts[k] for k in labels])
        rng.shuffle(codes)
    else:
        codes = rng.choice(len(labels), size=n, p=np.array([attribute.shares[k] for k in labels]))
    return pl.Series(codes, dtype=pl.UInt32).replace_strict(list(range(len(labels))), labels, return_dtype=pl.String)
