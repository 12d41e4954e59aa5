"""Level-k and cognitive-hierarchy models of the p-beauty contest (Nagel 1995; Camerer, Ho & Chong 2004).

One definition of each model's choices and population mean, used by the simulated engine's
``level_k`` and ``cognitive_hierarchy`` rules (which play them) and by the warehouse's τ fit
(which inverts them). Plain numpy on a ``GameRule``.
"""

from __future__ import annotations

import math

import numpy as np

from core.game import GameRule

#: Poisson tails below this are dropped (a level nobody in 10^15 agents would have).
TAIL = 1e-15


def level_zero_mean(rule: GameRule) -> float:
    """The mean of a uniform level-0 player: the middle of [low, high]."""
    return (rule.low + rule.high) / 2


def level_k_choices(rule: GameRule, max_level: int) -> np.ndarray:
    """Level-k choices x_0…x_max (x_0 is the level-0 mean), unrounded.

    x_k = clamp(offset + ratio × x_{k−1}): level k best-responds to everyone being level k − 1.
    """
    x = np.empty(max_level + 1)
    x[0] = level_zero_mean(rule)
    for level in range(1, max_level + 1):
        x[level] = rule.best_response(x[level - 1])
    return x


def poisson_levels_upto(tau: float, max_level: int) -> np.ndarray:
    """Poisson(τ) frequencies f_0…f_max (not renormalised)."""
    f = np.empty(max_level + 1)
    f[0] = math.exp(-tau)
    for level in range(1, max_level + 1):
        f[level] = f[level - 1] * tau / level
    return f


def poisson_levels(tau: float) -> np.ndarray:
    """Poisson(τ) frequencies f_0, f_1, … up to where the tail is negligible."""
    max_level = 1
    while 1 - poisson_levels_upto(tau, max_level).sum() > TAIL and max_level < 400:
        max_level += 1
    return poisson_levels_upto(tau, max_level)


def cognitive_hierarchy_choices(rule: GameRule, tau: float, max_level: int | None = None) -> np.ndarray:
    """Cognitive-hierarchy choices x_0…x_K (x_0 is the level-0 mean), unrounded.

    Level k believes the others are levels 0…k−1 in proportions f_j / Σ_{i<k} f_i
    (Poisson f) and names the best response to the mean of that belief. K defaults to
    the level beyond which the Poisson tail is negligible.
    """
    levels = len(poisson_levels(tau)) - 1 if max_level is None else max_level
    f = poisson_levels_upto(tau, levels)
    x = np.empty(levels + 1)
    x[0] = level_zero_mean(rule)
    for level in range(1, levels + 1):
        believed = float(np.dot(f[:level], x[:level]) / f[:level].sum())
        x[level] = rule.best_response(believed)
    return x


def cognitive_hierarchy_mean(rule: GameRule, tau: float) -> float:
    """The expected population mean Σ_k f_k x_k of a cognitive-hierarchy population."""
    x = cognitive_hierarchy_choices(rule, tau)
    return float(np.dot(poisson_levels_upto(tau, len(x) - 1), x))
