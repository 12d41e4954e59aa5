"""The sampling chain in numpy: a node's raw logits to next-token probabilities, as the engines sample."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engines import Sampling
from engines.shared_context.language import PENALTY_LAST_N


# --------------------------------------------------------------------------- the chain
@dataclass(frozen=True)
class Chain:
    """llama.cpp's sampling chain as llama-cpp-python 0.3 builds it, the documented semantics.

    Order: repeat penalty (over the tokens generated so far, last 64) → grammar mask →
    top-k → top-p → min-p → temperature → draw. Top-p and min-p see the probabilities at
    temperature 1 (they come before the temperature); temperature 0 takes the argmax of the
    penalised, masked logits (lowest token id on ties). ``top_k = 0`` and ``top_p = 1`` and
    ``min_p = 0`` and ``repeat_penalty = 1`` switch a step off.
    """

    temperature: float = Sampling.temperature
    top_k: int = Sampling.top_k
    top_p: float = Sampling.top_p
    min_p: float = Sampling.min_p
    repeat_penalty: float = Sampling.repeat_penalty

    @classmethod
    def of(cls, sampling: Sampling) -> Chain:
        """The chain of a batch's ``Sampling`` (the same knobs, on every engine)."""
        return cls(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.repeat_penalty)

    def probabilities(self, tokens: np.ndarray, logits: np.ndarray, previous: Sequence[int] = ()) -> np.ndarray:
        """Next-token probabilities over the allowed ``tokens`` (sorted ids) given their raw
        ``logits`` and the tokens generated before this step."""
        z = np.asarray(logits, np.float32).copy()
        if self.repeat_penalty != 1.0 and previous:
            seen = np.isin(tokens, np.asarray(previous[-PENALTY_LAST_N:]))
            # llama.cpp's fix of the CTRL penalty: negative logits are multiplied.
            z[seen] = np.where(z[seen] <= 0, z[seen] * np.float32(self.repeat_penalty), z[seen] / np.float32(self.repeat_penalty))
        z64 = z.astype(np.float64)
        p = np.zeros(len(z64))
        if self.temperature <= 0:
            p[int(np.argmax(z64))] = 1.0  # argmax takes the first maximum: the lowest id
            return p
        keep = np.ones(len(z64), bool)
        if 0 < self.top_k < len(z64):
            keep[np.argsort(-z64, kind="stable")[self.top_k:]] = False
        if self.top_p < 1.0:
            q = np.where(keep, np.exp(z64 - z64[keep].max()), 0.0)
            q /= q.sum()
            order = np.argsort(-q, kind="stable")
            cut = int(np.searchsorted(np.cumsum(q[order]), self.top_p)) + 1  # first cum >= top_p
            mask = np.zeros(len(z64), bool)
            mask[order[:cut]] = True
            keep &= mask
        if self.min_p > 0:
            keep &= z64 >= z64[keep].max() + math.log(self.min_p)
        scaled = z64 / self.temperature
        q = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
        return q / q.sum()
