"""Play one shard: render the agents' prompts, call the engine, parse the answers.

``ShardPlayer`` is plain Python (testable without Ray); ``tasks.play`` wraps it in a
Ray actor that owns one engine for its whole life, so a model loads once per actor.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from prompts.answers import parse_answers
from prompts.chat import split_cues
from prompts.modes import FINAL_CUE, PromptMode, get_mode
from prompts.render import render
from tasks.engines import Constraint, EngineSpec, RequestBatch, Sampling, build_engine
from tasks.environment import GameRule
from tasks.seeds import agent_seeds

#: Persona columns that are not attributes shown to agents.
NON_ATTRIBUTES = ("agent_id", "own_guesses", "group")


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment: an engine, a prompt mode, a temperature and a rule."""

    index: int
    run_id: str
    engine: EngineSpec
    prompt_mode: str
    temperature: float
    rule: GameRule
    max_reasoning_tokens: int = 256
    max_answer_tokens: int = 8
    custom: PromptMode | None = None  # a user's own template (arms.prompts mapping)

    @property
    def mode(self) -> PromptMode:
        if self.custom is not None:
            return self.custom
        if self.prompt_mode.endswith(".j2"):  # a user's own template file
            return PromptMode(self.prompt_mode, self.prompt_mode, "cot" in os.path.basename(self.prompt_mode), "custom template")
        return get_mode(self.prompt_mode)


class _ArrowPickled:
    """Pickles the dataclass's polars frame ``_frame_field`` as an Arrow table.

    Ray pickles task arguments and results with protocol 5, which hands an Arrow table's
    buffers over out of band (no copy into the pickle); a polars frame pickles as one
    serialized blob instead, ~15x slower for a shard of 50,000 agents.
    """

    _frame_field = ""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state[self._frame_field] = state[self._frame_field].to_arrow()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state[self._frame_field] = pl.from_arrow(state[self._frame_field])
        self.__dict__.update(state)


@dataclass
class ShardJob(_ArrowPickled):
    """Everything a worker needs to play one shard of one round."""

    arm: Arm
    seed: int
    round: int
    shard: int
    agents: pl.DataFrame  # agent_id, persona attributes…, optionally own_guesses
    shared: dict[str, Any] = field(default_factory=dict)  # template variables common to all agents

    _frame_field = "agents"


@dataclass
class ShardResult(_ArrowPickled):
    """A shard's guesses and where and how fast they were made."""

    guesses: pl.DataFrame
    node: str
    worker: str
    seconds: float

    _frame_field = "guesses"


class ShardPlayer:
    """Owns one engine and plays shards with it."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.engine = build_engine(spec)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def play(self, job: ShardJob, node: str = "local") -> ShardResult:
        start = time.perf_counter()
        arm, rule = job.arm, job.arm.rule
        agents = job.agents
        ids = agents["agent_id"].to_numpy().astype(np.int64)
        prompts = render(arm.mode.template, job.shared, _template_frame(agents))
        # Chat format: the prompt's last line (its cue) opens the assistant's turn instead.
        openings = None
        if getattr(self.engine, "prompt_format", "completion") == "chat":
            prompts, openings = split_cues(prompts)
        # Seeds depend on (seed, round, agent) only: every arm sees the same draws (paired arms).
        seeds = (agent_seeds(job.seed, ids, "sample", job.round) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        constraint = Constraint(rule.low, rule.high, rule.integer)
        reasoning: list[str | None] = [None] * len(ids)
        tokens_in = np.zeros(len(ids), np.int64)
        tokens_out = np.zeros(len(ids), np.int64)
        latency = np.zeros(len(ids), np.float64)
        errors: list[str | None] = [None] * len(ids)
        if arm.mode.reasoning:
            free = self.engine.generate(
                RequestBatch(ids, prompts, seeds, Sampling(arm.temperature, arm.max_reasoning_tokens), None, opening=openings)
            )
            reasoning = free.text
            if openings is not None:  # the answer continues the same assistant turn
                openings = [o + r + FINAL_CUE for o, r in zip(openings, free.text)]
            else:
                prompts = [p + r + FINAL_CUE for p, r in zip(prompts, free.text)]
            tokens_in += free.prompt_tokens
            tokens_out += free.completion_tokens
            latency += free.latency_s
            errors = list(free.error)
        answer = self.engine.generate(
            RequestBatch(ids, prompts, seeds, Sampling(arm.temperature, arm.max_answer_tokens), constraint, rule, openings)
        )
        parsed = parse_answers(pl.Series(answer.text, dtype=pl.String), rule.low, rule.high, rule.integer)
        engine_error = pl.Series([e2 or e1 for e1, e2 in zip(errors, answer.error)], dtype=pl.String)
        guesses = pl.DataFrame(
            {
                "run_id": arm.run_id,
                "round": job.round,
                "agent_id": ids,
                "shard": job.shard,
                "engine": self.spec.kind,
                "model": self.engine.model,
                "raw": pl.Series(answer.text, dtype=pl.String),
                "reasoning": pl.Series(reasoning, dtype=pl.String),
                "prompt_tokens": tokens_in + answer.prompt_tokens,
                "completion_tokens": tokens_out + answer.completion_tokens,
                "latency_s": latency + answer.latency_s,
                "attempts": answer.attempts,
                "engine_error": engine_error,
            }
        ).with_columns(
            parsed["guess"].alias("guess"),
            parsed["valid"].alias("valid"),
            pl.coalesce("engine_error", parsed["error"]).alias("error"),
        )
        # An engine error invalidates the answer even if its text happened to parse.
        guesses = guesses.with_columns(
            valid=pl.col("valid") & pl.col("engine_error").is_null(),
        ).with_columns(guess=pl.when(pl.col("valid")).then(pl.col("guess"))).drop("engine_error")
        return ShardResult(guesses, node, self.worker, time.perf_counter() - start)

    def close(self) -> None:
        self.engine.close()


def _template_frame(agents: pl.DataFrame) -> pl.DataFrame:
    """The per-agent template variables: ``persona`` (a struct of attributes) and history."""
    attributes = [c for c in agents.columns if c not in NON_ATTRIBUTES]
    columns = []
    if attributes:
        columns.append(pl.struct(attributes).alias("persona"))
    columns += [pl.col(c) for c in ("own_guesses", "group") if c in agents.columns]
    if not columns:
        return pl.DataFrame({"_": [None] * agents.height})
    return agents.select(columns)


def check_prompt_inputs(arm: Arm, personas: pl.DataFrame) -> None:
    """Refuse an arm whose prompt mode needs what the personas lack (backstories).

    Raises:
        ValueError: one line naming the mode and what is missing.
    """
    if not arm.mode.needs_backstory:
        return
    if "background" not in personas.columns or personas["background"].null_count() == personas.height:
        raise ValueError(
            f"arms.prompts: mode {arm.prompt_mode!r} shows each persona's backstory, but the personas have none "
            "(enable population.backstories, or use the 'persona' mode)"
        )
    missing = personas["background"].null_count()
    if missing:
        raise ValueError(f"arms.prompts: mode {arm.prompt_mode!r} needs a backstory for every persona; {missing} have none")


#: Columns never counted as population composition.
_NOT_COMPOSITION = ("agent_id", "background", "own_guesses", "group")
#: Attributes with more distinct values than this (ages, names) are not listed in prompts.
MAX_COMPOSITION_VALUES = 20


def population_context(personas: pl.DataFrame) -> dict[str, Any]:
    """The ``population`` template variable: the number of players and, for each
    categorical attribute, the count of each value (largest first), e.g. education →
    [{value: "High School", count: "200"}, …]."""
    attributes: dict[str, list[dict[str, str]]] = {}
    for name in personas.columns:
        if name in _NOT_COMPOSITION or personas.schema[name] not in (pl.String, pl.Categorical, pl.Enum, pl.Boolean):
            continue
        counts = personas[name].drop_nulls().value_counts(sort=True, name="count")
        if 0 < counts.height <= MAX_COMPOSITION_VALUES:
            ordered = counts.sort(["count", name], descending=[True, False])
            attributes[name] = [{"value": str(v), "count": f"{c:,}"} for v, c in ordered.iter_rows()]
    return {"n": f"{personas.height:,}", "attributes": attributes}


def groups_context(personas: pl.DataFrame, history: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The ``groups`` template variable: group → {n: its players, history: its earlier rounds}."""
    sizes = personas.group_by("group").len()
    return {g: {"n": f"{n:,}", "history": history.get(g, [])} for g, n in sizes.iter_rows()}


def game_context(rule: GameRule, n_players: int) -> dict[str, Any]:
    """The ``game`` template variable: the rule with numbers formatted for people."""
    return {
        "n_players": f"{n_players:,}",
        "low": f"{rule.low:g}",
        "high": f"{rule.high:g}",
        "ratio": rule.ratio,
        "offset": f"{rule.offset:g}",
        "describe": rule.describe(),
        "integer": rule.integer,
        "rounds": rule.rounds,
    }
