"""Reasoning depth in numbers: the cognitive-hierarchy τ that fits a mean, and paired tests.

Pure functions on arrays (numpy, scipy) — no DuckDB, Prefect or Ray — so each statistic can
be checked against its definition; ``warehouse.analyses`` feeds them stored guesses and
writes what they return into the warehouse, where SQL views show it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache, cached_property

import numpy as np
from scipy import optimize, stats

from core.game import GameRule

# The model the fit inverts is the one the simulated `cognitive_hierarchy` rule plays.
from core.hierarchy import TAIL, cognitive_hierarchy_choices, poisson_levels_upto

#: The largest τ searched. Beyond it a population is at the equilibrium for every practical
#: purpose (for 2/3 of the average its mean is below 0.1).
TAU_MAX = 20.0
#: Resamples of the bootstrap interval of τ.
RESAMPLES = 2000
#: Coverage of every interval here.
CONFIDENCE = 0.95
#: A fit's τ is found to this precision.
TAU_XTOL = 1e-5
#: Points of the grid that brackets each root (see ``Hierarchy._grid``).
_GRID_POINTS = 161
#: Real answers with more distinct values than this are binned for the bootstrap (see
#: ``bootstrap_means``).
BOOTSTRAP_BINS = 256
#: Bounds the bootstrap's working memory: resamples drawn at once × distinct guesses.
_CHUNK_CELLS = 2_000_000


def seed_for(*labels: object) -> int:
    """A 63-bit seed from labels (run id, round, group…): the same labels, the same draws."""
    digest = hashlib.sha256("\x1f".join(map(str, labels)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class TauFit:
    """The cognitive-hierarchy τ whose population mean equals an observed mean.

    ``fit`` says what happened: ``fitted``, ``no τ fits`` (the mean lies outside
    [``ch_mean_min``, ``ch_mean_max``], the means CH can produce for τ in [0, TAU_MAX]) or
    ``no valid guesses``. The interval is the bootstrap percentile interval mapped through
    the (monotone) mean(τ); an end beyond the reachable means sits at 0 or ``TAU_MAX``.
    """

    n: int
    mean: float | None
    tau: float | None
    tau_low: float | None
    tau_high: float | None
    fit: str
    ch_mean_min: float
    ch_mean_max: float


class Hierarchy:
    """The cognitive-hierarchy population mean of one game as a function of τ, inverted.

    Poisson(τ) levels, level 0 uniform on [low, high], level k best-responding to the
    normalised mix of levels below k (Camerer, Ho & Chong 2004). The mean moves
    monotonically from the level-0 mean (τ = 0) towards the equilibrium as τ grows, so
    ``brentq`` finds the one τ for any mean in between.
    """

    def __init__(self, rule: GameRule):
        self.rule = rule

    def mean(self, tau: float) -> float:
        """The population mean Σ_k f_k x_k of CH(τ), as ``core.hierarchy.cognitive_hierarchy_mean``.

        Levels are followed up to where the Poisson tail is below ``TAIL``, found in one call
        (``poisson_levels`` adds one level at a time: fine once per run, slow in a root search).
        """
        if tau <= 0:
            return (self.rule.low + self.rule.high) / 2
        levels = int(stats.poisson.isf(TAIL, tau)) + 1
        x = cognitive_hierarchy_choices(self.rule, tau, levels)
        return float(np.dot(poisson_levels_upto(tau, levels), x))

    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """mean(τ) on a grid over [0, TAU_MAX], denser at small τ: brentq then searches
        between two neighbouring grid points, a few evaluations instead of a dozen."""
        taus = TAU_MAX * np.linspace(0.0, 1.0, _GRID_POINTS) ** 2
        return taus, np.array([self.mean(t) for t in taus])

    @property
    def _ends(self) -> tuple[float, float]:
        means = self._grid[1]
        return float(means[0]), float(means[-1])

    @property
    def means(self) -> tuple[float, float]:
        """The smallest and largest mean CH produces for τ in [0, TAU_MAX]."""
        return min(self._ends), max(self._ends)

    def tau(self, mean: float, clamp: bool = False) -> float | None:
        """The τ whose CH mean is ``mean``; None when no τ in [0, TAU_MAX] gives it.

        With ``clamp``, a mean beyond the level-0 end gives 0 and one beyond the other
        end ``TAU_MAX`` (used for the ends of intervals).
        """
        at_zero, at_max = self._ends
        if at_zero == at_max:  # e.g. ratio 1 without offset: every level names the midpoint
            return 0.0 if (clamp or mean == at_zero) else None
        # Position of the mean along the path from τ = 0 (0) to TAU_MAX (1).
        position = (mean - at_zero) / (at_max - at_zero)
        if position <= 0:
            return 0.0 if (clamp or position == 0) else None
        if position >= 1:
            return TAU_MAX if (clamp or position == 1) else None
        taus, means = self._grid
        # The grid point where the (monotone) curve passes the mean brackets the root.
        ahead = (means - mean) * np.sign(at_max - at_zero) >= 0
        i = int(np.argmax(ahead))
        return float(optimize.brentq(lambda t: self.mean(t) - mean, taus[i - 1], taus[i], xtol=TAU_XTOL))


@cache
def hierarchy_for(rule: GameRule) -> Hierarchy:
    """One ``Hierarchy`` per game in this process: its grid (~0.1 s) is built once, not every round."""
    return Hierarchy(rule)


def bootstrap_means(values: np.ndarray, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """Means of ``resamples`` bootstrap resamples of ``values`` (drawn with replacement).

    A resample's mean depends only on how often it draws each distinct value, so resamples
    are drawn as multinomial counts over the distinct values (``bootstrap_means_of_counts``).
    """
    return bootstrap_means_of_counts(*value_counts(values), seed, resamples)


def value_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values (ascending) and how often each occurs: what the counted forms take."""
    return np.unique(np.asarray(values, dtype=np.float64), return_counts=True)


def bootstrap_means_of_counts(distinct: np.ndarray, counts: np.ndarray, seed: int, resamples: int = RESAMPLES) -> np.ndarray:
    """``bootstrap_means`` of the values ``distinct`` (ascending) seen ``counts`` times each.

    Resamples are multinomial counts over the distinct values: the same distribution as
    resampling agents, at a cost of distinct values (≤ 101 in an integer game), not agents,
    per resample — 100,000 agents cost what 100 do. More than ``BOOTSTRAP_BINS`` distinct
    values (real answers) are pooled into that many equal-width bins, each value replaced
    by its bin's mean: the mean is kept exactly and the variance loses at most width²/12
    (< 0.02 for [0, 100], against hundreds for spread guesses).
    """
    distinct, counts = np.asarray(distinct, dtype=np.float64), np.asarray(counts, dtype=np.int64)
    n = int(counts.sum())
    if len(distinct) > BOOTSTRAP_BINS:
        edges = np.linspace(distinct[0], distinct[-1], BOOTSTRAP_BINS + 1)
        bins = np.clip(np.searchsorted(edges, distinct, side="right") - 1, 0, BOOTSTRAP_BINS - 1)
        counts_binned = np.bincount(bins, weights=counts, minlength=BOOTSTRAP_BINS)
        sums = np.bincount(bins, weights=counts * distinct, minlength=BOOTSTRAP_BINS)
        keep = counts_binned > 0
        distinct, counts = sums[keep] / counts_binned[keep], counts_binned[keep]
    rng = np.random.default_rng(seed)
    out = np.empty(resamples)
    step = max(1, _CHUNK_CELLS // len(distinct))
    for start in range(0, resamples, step):
        size = min(step, resamples - start)
        out[start:start + size] = rng.multinomial(n, counts / n, size=size) @ distinct / n
    return out


def fit_tau(values: np.ndarray, hierarchy: Hierarchy, seed: int, resamples: int = RESAMPLES) -> TauFit:
    """Fit τ to the mean of ``values`` (valid guesses), with a bootstrap interval
    (``fit_tau_to_counts`` of their distinct values and counts)."""
    return fit_tau_to_counts(*value_counts(values), hierarchy, seed, resamples)


def fit_tau_to_counts(distinct: np.ndarray, counts: np.ndarray, hierarchy: Hierarchy, seed: int,
                      resamples: int = RESAMPLES) -> TauFit:
    """Fit τ to the mean of valid guesses given as distinct values (ascending) and how many
    agents named each — what SQL's ``GROUP BY guess`` returns, a few rows for a million
    agents — with a bootstrap interval.

    The percentile interval of the bootstrap means is mapped through τ(mean): τ is a
    monotone function of the mean, so this is the percentile interval of the bootstrap
    τs without fitting every resample.
    """
    distinct, counts = np.asarray(distinct, dtype=np.float64), np.asarray(counts, dtype=np.int64)
    low_mean, high_mean = hierarchy.means
    n = int(counts.sum())
    if n == 0:
        return TauFit(0, None, None, None, None, "no valid guesses", low_mean, high_mean)
    mean = float(counts @ distinct / n)
    tau = hierarchy.tau(mean)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(bootstrap_means_of_counts(distinct, counts, seed, resamples), [alpha, 1 - alpha])
    if hi < low_mean or lo > high_mean:  # the whole interval lies outside what CH produces
        ends = (None, None)
    else:
        a, b = hierarchy.tau(float(lo), clamp=True), hierarchy.tau(float(hi), clamp=True)
        ends = (min(a, b), max(a, b))
    return TauFit(n, mean, tau, ends[0], ends[1], "fitted" if tau is not None else "no τ fits",
                  low_mean, high_mean)


@dataclass(frozen=True)
class PairedTest:
    """Two arms' guesses of the same agents in one round: a − b, agent by agent.

    ``ci95_low``/``ci95_high`` is the t interval of the mean difference; ``wilcoxon_p`` the
    two-sided Wilcoxon signed-rank p-value (zero differences dropped, Wilcoxon's
    convention; normal approximation with tie correction beyond 50 pairs, scipy's default).
    """

    n_pairs: int
    mean_a: float | None
    mean_b: float | None
    mean_difference: float | None
    ci95_low: float | None
    ci95_high: float | None
    median_difference: float | None
    wilcoxon_statistic: float | None
    wilcoxon_p: float | None
    note: str | None


def paired_test(a: np.ndarray, b: np.ndarray) -> PairedTest:
    """Compare paired guesses ``a[i]`` and ``b[i]`` (the same agent in two arms)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    if n == 0:
        return PairedTest(0, None, None, None, None, None, None, None, None, "no agent answered validly in both arms")
    d = a - b
    head = dict(n_pairs=n, mean_a=float(a.mean()), mean_b=float(b.mean()), mean_difference=float(d.mean()),
                median_difference=float(np.median(d)))
    if n < 2:
        return PairedTest(**head, ci95_low=None, ci95_high=None, wilcoxon_statistic=None, wilcoxon_p=None,
                          note="one pair: no interval or test")
    if not d.any():
        return PairedTest(**head, ci95_low=0.0, ci95_high=0.0, wilcoxon_statistic=None, wilcoxon_p=None,
                          note="every agent answered the same in both arms")
    if np.all(d == d[0]):  # a constant shift: the t interval has zero width
        low = high = float(d[0])
    else:
        low, high = stats.ttest_rel(a, b).confidence_interval(CONFIDENCE)
    w = stats.wilcoxon(d)
    return PairedTest(**head, ci95_low=float(low), ci95_high=float(high), wilcoxon_statistic=float(w.statistic),
                      wilcoxon_p=float(w.pvalue), note=None)
