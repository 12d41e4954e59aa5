"""The simulated engine: no model, a batched server and a named decision rule.

It exists for scale benchmarks and fast tests, after the paper's dummy agent (wait, then
answer a random integer). The server admits up to ``concurrency`` requests at a time and
answers each wave after ``latency_s``; a decision rule picks each agent's number. Rows it
produces are labelled engine=simulated and model=simulated/<rule> — never an LLM.
"""

from __future__ import annotations

import math
import time
from typing import Literal

import numpy as np
import polars as pl
from pydantic import Field

from tasks.engines import CompletionBatch, EngineSpec, RequestBatch, register
from tasks.seeds import splitmix64, uniform01


class SimulatedSpec(EngineSpec):
    """A simulated batched inference server with a decision rule (no model)."""

    kind: Literal["simulated"] = "simulated"
    rule: Literal["uniform"] = Field("uniform", description="The decision rule: uniform = a random number in [low, high] (the paper's dummy agent).")
    latency_s: float = Field(0.0, ge=0, description="Seconds the server takes to answer one wave of requests.")
    concurrency: int = Field(100_000, ge=1, description="Requests the server admits at once (per engine, i.e. per Ray actor).")

    @property
    def model_name(self) -> str:
        return f"simulated/{self.rule}"


class SimulatedEngine:
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
        if batch.constraint is None:  # a free-text (reasoning) request
            text = ["(simulated: no reasoning)"] * n
        else:
            text = self._decide(batch)
        prompt_tokens = _word_counts(pl.Series(batch.prompt, dtype=pl.String))
        return CompletionBatch(
            text=text,
            prompt_tokens=prompt_tokens.astype(np.int64),
            completion_tokens=np.ones(n, np.int64),
            latency_s=latency.astype(np.float64),
            attempts=np.ones(n, np.int64),
            error=[None] * n,
        )

    def _decide(self, batch: RequestBatch) -> list[str]:
        c = batch.constraint
        u = uniform01(splitmix64(np.asarray(batch.seed, dtype=np.uint64)))
        if c.integer:
            lo, hi = math.ceil(c.low), math.floor(c.high)
            values = lo + np.minimum((u * (hi - lo + 1)).astype(np.int64), hi - lo)
            return pl.Series(values).cast(pl.String).to_list()
        values = np.round(c.low + u * (c.high - c.low), 2)
        return pl.Series(values).cast(pl.String).to_list()

    def close(self) -> None:
        pass


def _word_counts(prompts: pl.Series) -> np.ndarray:
    """Whitespace-separated words per prompt, counted once per distinct prompt.

    Agents with the same context share a prompt (a handful of texts for a whole shard in
    round 1), and a regex over every row was the engine's hottest line at 100k agents.
    """
    distinct = prompts.unique()
    counts = distinct.str.count_matches(r"\S+")
    return prompts.replace_strict(distinct, counts, return_dtype=pl.Int64).to_numpy()


register("simulated", SimulatedSpec, SimulatedEngine)
