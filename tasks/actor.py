"""The Ray actor of the play stage: it owns one engine and plays shards with it.

``ShardPlayer`` is plain Python (testable without Ray): render the agents' prompts, call
the engine, parse the answers. ``AgentWorker`` wraps it in a Ray actor, so a model loads
once per actor and serves every round. This module imports neither Prefect nor the
warehouse: Ray imports it in every worker process, and an actor then starts in about a
second instead of several.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl
import ray

from core.seeds import sampling_seeds
from design.arms import Arm
from engines import CompletionBatch, Constraint, EngineSpec, RequestBatch, SamplingSettings, build_engine
from engines.shared_context.board import AnswerBoard
from prompts.answers import parse_answers
from prompts.chat import split_cues
from prompts.context import agent_variables
from prompts.modes import FINAL_CUE
from prompts.render import render
from tasks.timings import mark


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
    limit_wait_s: float = 0.0  # of the engine's requests, waiting on rate limits (summed over requests)
    #: Shared-context answers: each group's exact distribution (``answer_distributions`` rows).
    distributions: pl.DataFrame | None = None
    #: Shared-context answers on an engine that counts them: tokens decoded, and the least
    #: that could have been (``Engine.tokens_evaluated``, ``tokens_bound``); else None.
    tokens_evaluated: int | None = None
    tokens_bound: int | None = None

    _frame_field = "guesses"


class ShardPlayer:
    """Owns one engine and plays shards with it."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.engine = build_engine(spec)
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        self._ahead: tuple[int | None, int | None] | None = None  # the counters before answering ahead

    def answer_ahead(self, job: ShardJob) -> None:
        """Answer ``job`` for the distributions the engine keeps, and drop its guesses: the shards
        that hold its prompts then only draw. Its tokens are counted in the next shard's."""
        counters = self._ahead or (self.engine.tokens_evaluated, self.engine.tokens_bound)
        self.play(job)
        self._ahead = counters

    def play(self, job: ShardJob, node: str = "local") -> ShardResult:
        start = time.perf_counter()
        waited = self.engine.limit_wait_s  # engines with rate limits count their waits
        # Engines that count their shared answers' tokens: since this shard began, or since the
        # answers given ahead of it.
        work = self._ahead or (self.engine.tokens_evaluated, self.engine.tokens_bound)
        self._ahead = None
        arm, rule = job.arm, job.arm.rule
        agents = job.agents
        ids = agents["agent_id"].to_numpy().astype(np.int64)
        prompts = render(arm.mode.template, job.shared, agent_variables(agents))
        # Chat format: the prompt's last line (its cue) opens the assistant's turn instead.
        openings = None
        if self.engine.prompt_format == "chat":
            prompts, openings = split_cues(prompts)
        # Seeds depend on (seed, round, agent) only: every arm sees the same draws (paired arms).
        seeds = sampling_seeds(job.seed, ids, job.round)
        constraint = Constraint(rule.low, rule.high, rule.integer)
        settings = arm.sampling or SamplingSettings()
        reasoning: list[str | None] = [None] * len(ids)
        tokens_in = np.zeros(len(ids), np.int64)
        tokens_out = np.zeros(len(ids), np.int64)
        latency = np.zeros(len(ids), np.float64)
        errors: list[str | None] = [None] * len(ids)
        ask = RequestBatch(ids, prompts, seeds, settings.sampling(arm.temperature, arm.max_answer_tokens), constraint, rule, openings)
        if arm.mode.reasoning:
            free, answer = self.engine.reason_and_answer(
                RequestBatch(ids, prompts, seeds, settings.sampling(arm.temperature, arm.max_reasoning_tokens), None, opening=openings),
                ask, FINAL_CUE,
            )
            reasoning = free.text
            tokens_in += free.prompt_tokens
            tokens_out += free.completion_tokens
            latency += free.latency_s
            errors = list(free.error)
        else:
            answer = self.engine.generate(ask)
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
                "shared_prompt": answer.shared_prompt if answer.shared_prompt is not None else np.zeros(len(ids), bool),
                "context": pl.Series(answer.context if answer.context is not None else [None] * len(ids), dtype=pl.String),
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
        distributions = None
        if answer.distributions is not None:  # shared-context answers: each group's exact distribution
            distributions = answer.distributions.select(
                pl.lit(arm.run_id).alias("run_id"), pl.lit(job.round, pl.Int32).alias("round"),
                pl.lit(job.shard, pl.Int32).alias("shard"), "context", "answer", "probability", "agents",
            )
        counted = None not in work and answer.shared_prompt is not None and not arm.mode.reasoning
        return ShardResult(guesses, node, self.worker, time.perf_counter() - start,
                           self.engine.limit_wait_s - waited, distributions,
                           self.engine.tokens_evaluated - work[0] if counted else None,
                           self.engine.tokens_bound - work[1] if counted else None)

    def play_agents(self, arm: Arm, seed: int, round_: int, shard: int, agents: pl.DataFrame, shared: dict[str, Any]) -> ShardResult:
        """One shard of ``agents`` in this process (``keynes plan``'s calibration, ``design.plan.Player``)."""
        return self.play(ShardJob(arm, seed, round_, shard, agents, shared))

    def close(self) -> None:
        """Release the engine (its model and connections)."""
        self.engine.close()


class HostedBoard:
    """A pool's answer board (``engines.shared_context.board``) as its other actors see it: in its first actor,
    the named actor ``host`` (looked up at first use, when it has been created)."""

    def __init__(self, host: str):
        self.name = host
        self._host: Any = None

    @property
    def host(self) -> Any:
        if self._host is None:
            self._host = ray.get_actor(self.name)
        return self._host

    def claim(self, owner: int, key: str) -> bool:
        return ray.get(self.host.board_claim.remote(owner, key))

    def publish(self, key: str, found: Any) -> None:
        self.host.board_publish.remote(key, found)  # not waited for: a claimant's peers wait instead

    def wait(self, keys: list[str], timeout: float) -> dict[str, Any]:
        return ray.get(self.host.board_wait.remote(keys, timeout))


@ray.remote(concurrency_groups={"board": 2})
class AgentWorker:
    """A Ray actor that owns one engine and plays shards with it.

    A pool of several (``peers``) shares its engines' answer distributions: the first actor
    (``host`` None) holds the pool's board and serves it on threads of its own (the ``board``
    concurrency group) while it plays; the others reach it by its actor name, ``host``. Shards
    are played one at a time (Ray's default group).
    """

    def __init__(self, spec: EngineSpec, owner: int = 0, peers: int = 1, host: str | None = None):
        mark("actor: started")
        self.player = ShardPlayer(spec)
        self.board = AnswerBoard() if peers > 1 and host is None else None
        if peers > 1:
            self.player.engine.share_answers(self.board or HostedBoard(host), owner, peers)
        mark("actor: engine built")
        self.node = ray.get_runtime_context().get_node_id()
        self.first = True  # no shard played yet (KEYNES_TIMINGS marks the first)

    @ray.method(concurrency_group="board")
    def board_claim(self, owner: int, key: str) -> bool:
        assert self.board is not None
        return self.board.claim(owner, key)

    @ray.method(concurrency_group="board")
    def board_publish(self, key: str, found: Any) -> None:
        assert self.board is not None
        self.board.publish(key, found)

    @ray.method(concurrency_group="board")
    def board_wait(self, keys: list[str], timeout: float) -> dict[str, Any]:
        assert self.board is not None
        return self.board.wait(keys, timeout)

    def play(self, job: ShardJob) -> ShardResult:
        if self.first:
            mark("actor: first shard started")
        result = self.player.play(job, node=self.node)
        if self.first:
            self.first = False
            mark("actor: first shard played")
        return result

    def answer_ahead(self, job: ShardJob) -> None:
        """``ShardPlayer.answer_ahead``: before the shards that need the job's prompts."""
        mark("actor: answering ahead")
        self.player.answer_ahead(job)
        mark("actor: answered ahead")

    def complete(self, batch: RequestBatch) -> CompletionBatch:
        """Completions from this actor's engine outside a game (e.g. persona backstories)."""
        return self.player.engine.generate(batch)

    def close(self) -> None:
        """Release the engine before the actor is killed (a model's memory, HTTP clients)."""
        self.player.close()

    def where(self) -> dict[str, Any]:
        return {"node": self.node, "worker": self.player.worker, "pid": os.getpid()}
