"""The simulated engine: no model, a batched server and a named behavioural rule.

It exists for scale benchmarks, fast tests and behavioural baselines. The server admits
up to ``concurrency`` requests at a time and answers each wave after ``latency_s``; a
decision rule picks each agent's number (see ``SimulatedSpec.rule``). Rows it produces are
labelled engine=simulated and model=simulated/<rule>… — never presented as an LLM.
"""

from __future__ import annotations

import math
import time
from typing import Literal, Sequence

import numpy as np
import polars as pl
from pydantic import Field, field_validator

from core.game import GameRule
from core.hierarchy import cognitive_hierarchy_choices, level_k_choices, poisson_levels
from core.seeds import splitmix64, uniform01
from engines import CompletionBatch, EngineBase, EngineSpec, RequestBatch, register

#: Independent random streams drawn from one per-request seed.
_STREAM_LEVEL = np.uint64(0x5EED_1E7E_1000_0001)
_STREAM_NOISE_1 = np.uint64(0x5EED_0015_E000_0002)
_STREAM_NOISE_2 = np.uint64(0x5EED_0015_E000_0003)


class SimulatedSpec(EngineSpec):
    """A simulated batched inference server with a behavioural decision rule (no model).

    Rules (behavioural baselines from the literature, not LLMs):

    - ``uniform``: a random number in [low, high] — the paper's dummy agent.
    - ``level_k``: level 0 names a uniform random number; level k best-responds to
      everyone being level k − 1: x_k = clamp(offset + ratio × x_{k−1}) with x_0 the
      level-0 mean (low + high) / 2 — for 2/3 of the average: 50, 33.33, 22.22, …
      ``k`` is every agent's level, or a mapping level → share to draw levels from.
    - ``cognitive_hierarchy`` (Camerer, Ho & Chong 2004): levels are Poisson(``tau``);
      level 0 is uniform; level k best-responds to the mixture of levels 0…k−1 with
      Poisson weights renormalised over those levels (continuum approximation: the
      player's own weight in the mean is ignored).

    Each agent's level is drawn from its per-request seed (so, like every sampled answer,
    it is redrawn each round). ``noise`` adds gaussian noise (standard deviation in game
    units) to level ≥ 1 choices, clipped to the bounds. In integer games choices are
    rounded to the nearest integer (halves up).
    """

    kind: Literal["simulated"] = "simulated"
    rule: Literal["uniform", "level_k", "cognitive_hierarchy"] = Field(
        "uniform",
        description="The decision rule: uniform (the paper's dummy agent), level_k, or cognitive_hierarchy.",
    )
    k: int | dict[int, float] = Field(
        1, description="level_k: every agent's level, or a mapping level → share from which each agent's level is drawn."
    )
    tau: float = Field(1.5, gt=0, description="cognitive_hierarchy: the mean level τ of the Poisson level frequencies.")
    noise: float = Field(0.0, ge=0, description="Standard deviation of gaussian noise added to level ≥ 1 choices (clipped to the bounds).")
    latency_s: float = Field(0.0, ge=0, description="Seconds the server takes to answer one wave of requests.")
    concurrency: int = Field(100_000, ge=1, description="Requests the server admits at once (per engine, i.e. per Ray actor).")

    @field_validator("k")
    @classmethod
    def _levels(cls, k: int | dict[int, float]) -> int | dict[int, float]:
        if isinstance(k, int):
            if k < 0:
                raise ValueError(f"level {k} is negative")
            return k
        if not k or any(level < 0 for level in k) or any(w < 0 for w in k.values()) or sum(k.values()) <= 0:
            raise ValueError(f"{k!r}: expected non-negative levels with non-negative shares summing above 0")
        return k

    @property
    def batch(self) -> int:
        return self.concurrency

    @property
    def model_name(self) -> str:
        if self.rule == "level_k":
            levels = self.k if isinstance(self.k, int) else ",".join(f"{lv}:{w:g}" for lv, w in sorted(self.k.items()))
            return f"simulated/level_k(k={levels}{self._noise_label})"
        if self.rule == "cognitive_hierarchy":
            return f"simulated/cognitive_hierarchy(tau={self.tau:g}{self._noise_label})"
        return f"simulated/{self.rule}"

    @property
    def _noise_label(self) -> str:
        return f",noise={self.noise:g}" if self.noise else ""

    def count_tokens(self, prompts: Sequence[str]) -> np.ndarray:
        """The simulated server's tokens: words."""
        return np.array([len(p.split()) for p in prompts], np.int64)

    def predicted_seconds(
        self, agents: int, rounds: int, phases: int, actors: int, seconds_per_agent: float | None, tokens_per_agent: float | None,
        shard_seconds_per_agent: float | None = None,
    ) -> float:
        """A batched server: each actor answers waves of ``concurrency`` requests, ``latency_s`` each."""
        return rounds * phases * math.ceil(agents / (max(1, actors) * self.concurrency)) * self.latency_s


class SimulatedEngine(EngineBase):
    """Answers with a decision rule after the latency of a batched server."""

    kind = "simulated"

    def __init__(self, spec: SimulatedSpec):
        self.spec = spec
        self.model = spec.model_name

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        n = len(batch)
        waves = math.ceil(n / self.spec.concurrency) if n else 0
        if self.spec.latency_s and waves:
            time.sleep(waves * self.spec.latency_s)
        wave = np.arange(n, dtype=np.int64) // self.spec.concurrency
        latency = (wave + 1) * self.spec.latency_s
        if batch.constraint is None:  # free text (reasoning, backstories): a labelled stand-in
            text = self._free_text(batch)
        else:
            text = self._decide(batch)
        prompt_tokens = _word_counts(batch.prompt)
        return CompletionBatch(
            text=text,
            prompt_tokens=prompt_tokens.astype(np.int64),
            completion_tokens=np.ones(n, np.int64),
            latency_s=latency.astype(np.float64),
            attempts=np.ones(n, np.int64),
            error=[None] * n,
        )

    def _free_text(self, batch: RequestBatch) -> list[str]:
        """Deterministic, clearly labelled text: a digest of (prompt, seed), no model."""
        digest = pl.Series(batch.prompt, dtype=pl.String).hash(seed=0).to_numpy() ^ np.asarray(batch.seed, dtype=np.uint64)
        codes = pl.Series(splitmix64(digest) >> np.uint64(32)).cast(pl.String)
        return pl.select(pl.concat_str(pl.lit("(simulated text #"), codes, pl.lit(")"))).to_series().to_list()

    def _decide(self, batch: RequestBatch) -> pl.Series:
        values = decide(self.spec, batch.constraint, np.asarray(batch.seed, dtype=np.uint64), batch.rule)
        if batch.constraint.integer:
            return pl.Series(values.astype(np.int64)).cast(pl.String)
        return pl.Series(values).cast(pl.String)

    def close(self) -> None:
        pass


def _word_counts(prompts: Sequence[str]) -> np.ndarray:
    """Whitespace-separated words per prompt, counted once per distinct prompt.

    Agents with the same context share a prompt (often one text for a whole shard in
    round 1, the same object repeated): counting each distinct text once and looking
    the others up is what keeps this off the profile at a million agents.
    """
    counts = {text: len(text.split()) for text in set(prompts)}
    return np.fromiter((counts[p] for p in prompts), np.int64, len(prompts))


def decide(spec: SimulatedSpec, constraint, seeds: np.ndarray, rule: GameRule | None) -> np.ndarray:
    """Every agent's number under the spec's rule, from its per-request seed.

    Level-0 (and ``uniform``) agents draw the same uniform number from the same seed,
    so arms that differ only in the rule stay paired.
    """
    u = uniform01(splitmix64(seeds))
    level0 = _uniform_answers(u, constraint)
    if spec.rule == "uniform":
        return level0
    if rule is None:
        raise ValueError(f"the simulated rule {spec.rule!r} needs the game rule in the request batch")
    u_level = uniform01(splitmix64(seeds ^ _STREAM_LEVEL))
    if spec.rule == "level_k":
        if isinstance(spec.k, int):
            level = np.full(len(seeds), spec.k, np.int64)
        else:
            keys = np.array(sorted(spec.k), np.int64)
            shares = np.array([spec.k[lv] for lv in keys], np.float64)
            level = keys[_inverse_cdf(shares / shares.sum(), u_level)]
        choices = level_k_choices(rule, int(level.max(initial=0)))
    else:
        f = poisson_levels(spec.tau)
        level = _inverse_cdf(f / f.sum(), u_level)
        choices = cognitive_hierarchy_choices(rule, spec.tau, int(level.max(initial=0)))
    values = choices[level]
    if spec.noise:
        # Box–Muller from two more independent streams of the same seed.
        u1 = 1.0 - uniform01(splitmix64(seeds ^ _STREAM_NOISE_1))
        u2 = uniform01(splitmix64(seeds ^ _STREAM_NOISE_2))
        values = values + spec.noise * np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)
    values = np.clip(values, constraint.low, constraint.high)
    values = np.floor(values + 0.5) if constraint.integer else np.round(values, 2)
    values = np.clip(values, math.ceil(constraint.low), math.floor(constraint.high)) if constraint.integer else values
    return np.where(level == 0, level0, values)


def _uniform_answers(u: np.ndarray, constraint) -> np.ndarray:
    """A uniform random answer in [low, high]: integers, or two decimals."""
    if constraint.integer:
        lo, hi = math.ceil(constraint.low), math.floor(constraint.high)
        return (lo + np.minimum((u * (hi - lo + 1)).astype(np.int64), hi - lo)).astype(np.float64)
    return np.round(constraint.low + u * (constraint.high - constraint.low), 2)


def _inverse_cdf(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Indices drawn with probabilities ``p`` from uniforms ``u`` in [0, 1)."""
    index = np.searchsorted(np.cumsum(p), u, side="right")
    return np.minimum(index, len(p) - 1).astype(np.int64)


register("simulated", SimulatedSpec, SimulatedEngine)
