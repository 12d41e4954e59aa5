"""Largest-remainder rounding: exact integer counts from shares, summing to the total.

Used wherever a population is split by shares (persona quotas, name quotas, the
engines of a mixture), so every split rounds the same way.
"""

from __future__ import annotations

import numpy as np


def quota_counts(shares: np.ndarray | list[float] | dict[str, float], n: int) -> np.ndarray:
    """Exact counts per category: floor(share × n), the remainder to the largest fractions.

    Shares are normalised first. Ties go to the category listed first.
    ``counts.sum() == n`` always.
    """
    p = np.asarray(list(shares.values()) if isinstance(shares, dict) else shares, dtype=np.float64)
    p = p / p.sum()
    raw = p * n
    counts = np.floor(raw).astype(np.int64)
    left = n - int(counts.sum())
    if left:
        # stable sort on -fraction: equal fractions keep their listed order
        order = np.argsort(-(raw - counts), kind="stable")
        counts[order[:left]] += 1
    return counts
