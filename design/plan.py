"""``keynes plan``: what an experiment will cost before anything runs.

Per arm: LLM calls (agents × rounds × phases, exact), prompt and completion tokens (the real
prompts of a sample of agents, rendered for every round and counted with the engine's own
tokenizer), time and, when the engine config names prices, cost. Time and completion tokens
come from a short calibration: a few sampled agents play round 1 on the configured engine,
in this process, with their real prompts and seeds. Nothing is written to the warehouse.

On an engine that sends requests and answers the agents that share a prompt by ``n`` completions
of one request (``EngineSpec.batched_choices``, the openai engine's ``completions_per_request``),
each round and phase also gets its requests, prompt and completion tokens and cost both ways — one
request per agent, and per distinct prompt of each shard (``request_rows``) — and the arm's
tokens and cost are the batched way's.

On an engine that answers each distinct prompt once (shared context: llama.cpp's and vLLM's
exact distributions), time follows the prompts, not the agents: each round's distinct prompts
(counted over the whole population; with agents told their own guesses, the histories their
agents are likely to have if every guess is drawn as the calibration's round 1 answered, never
more than one per persona and possible history) times their tokens past the prefix they share
(the prompt trie: agents with the same first guesses share their prompt up to the next one) and
the answer tree's, at the calibration's seconds a token, plus each agent's own part (rendering,
drawing and parsing its answer), timed on many agents with the prompts just computed.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

import numpy as np
import polars as pl

from core.game import history_row
from design.arms import Arm
from design.config import ExperimentConfig
from design.seen import seen
from design.shards import pool_size, shard_size
from engines import EngineSpec
from engines.mixture import MixtureSpec
from populations.sampler import sample
from prompts.context import agent_variables
from prompts.modes import FINAL_CUE
from prompts.render import distinct_agents, prompt_keys, render

#: Agents whose prompts are rendered and counted (evenly spread over the population).
SAMPLE = 24
#: Agents that play round 1 on the real engine to calibrate time and completion tokens.
CALIBRATE = 3
#: Characters per token where no tokenizer is at hand (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4.0
#: Distinct prompts of a round rendered to measure their trie (evenly spread over them).
TRIE_SAMPLE = 256
#: Agents of a second calibration shard on the shared path, all with the prompts just computed:
#: what an agent costs beyond its prompt's distribution (rendering, drawing, parsing its answer).
BOOKKEEPING_AGENTS = 6000
#: Times a shard's fixed costs are measured (the median counts): a one-agent shard played again
#: on the shared path, the calibration shard committed to a scratch warehouse.
SHARD_REPEATS = 5


class Player(Protocol):
    """What the calibration plays on: an engine in this process (``tasks.actor.ShardPlayer``)."""

    engine: Any

    def play_agents(self, arm: Arm, seed: int, round_: int, shard: int, agents: pl.DataFrame, shared: dict[str, Any]) -> Any:
        """One shard of ``agents`` in ``round_``, with the round's shared variables."""

    def close(self) -> None:
        """Release the engine."""


class Committer(Protocol):
    """Commits a played shard to a scratch warehouse as the play stage does (``cli.plan``): what
    the driver spends on every commit whatever its size."""

    def __call__(self, arm: Arm, round_: int, shard: int, agents: pl.DataFrame, result: Any) -> float:
        """Seconds to commit ``result`` (a ``ShardResult`` of ``agents``) as shard ``shard``."""


@dataclass
class ArmPlan:
    """The estimate of one arm."""

    arm: Arm
    agents: int
    rounds: int
    phases: int
    prompt_tokens: float | None
    completion_tokens: float | None
    seconds: float | None
    cost: float | None
    basis: str
    #: On the shared-context path: the distinct prompts it evaluates over all rounds (an estimate
    #: when agents are told their own guesses); None where every call is an agent's own.
    distinct_prompts: float | None = None
    #: Where agents are told their own guesses: the most distinct prompts there can be.
    distinct_prompts_at_most: float | None = None
    #: An engine that batches requests: each round and phase both ways (``request_rows``).
    requests: list[dict[str, Any]] | None = None

    @property
    def calls(self) -> int:
        """LLM calls: every agent, every round, every phase (reasoning, then the answer)."""
        return self.agents * self.rounds * self.phases

    def row(self) -> dict[str, Any]:
        return {
            "arm": self.arm.index, "run_id": self.arm.run_id, "engine": self.arm.engine.kind, "model": self.arm.engine.model_name,
            "prompt_mode": self.arm.prompt_mode, "agents": self.agents, "rounds": self.rounds, "phases": self.phases,
            "calls": self.calls, "prompt_tokens": _round(self.prompt_tokens), "completion_tokens": _round(self.completion_tokens),
            "seconds": None if self.seconds is None else round(self.seconds, 1), "cost": None if self.cost is None else round(self.cost, 4),
            "basis": self.basis, "distinct_prompts": _round(self.distinct_prompts),
            "distinct_prompts_at_most": _round(self.distinct_prompts_at_most), "requests": self.requests,
        }


def _round(value: float | None) -> int | None:
    return None if value is None else int(round(value))


# ------------------------------------------------------------------------------ prompts
def sample_agents(personas: pl.DataFrame, k: int) -> pl.DataFrame:
    """``k`` agents spread evenly over the population (all of them when it is smaller)."""
    if personas.height <= k:
        return personas
    return personas[np.unique(np.linspace(0, personas.height - 1, k).astype(np.int64)).tolist()]


def backstory_placeholder(personas: pl.DataFrame, max_tokens: int) -> pl.DataFrame:
    """Backstories are written by an LLM at run time, one per agent (seeded by it): a stand-in of
    their token budget whose last word is the agent's id, so that every agent's prompt is its own,
    as it will be."""
    words = " ".join(["word"] * max(0, max_tokens - 1))
    return personas.with_columns(background=pl.format("{} {}", pl.lit(words), pl.col("agent_id")))


def fake_history(round_: int, rule: Any) -> list[dict[str, Any]]:
    """Outcomes of the rounds before ``round_`` as a prompt shows them, with plausible numbers
    (the mean shrinking by the ratio each round): only their length matters here."""
    mean = (rule.low + rule.high) / 2
    past = []
    for r in range(1, round_):
        mean *= float(rule.fraction)
        past.append(history_row(r, 0, mean, mean * float(rule.fraction), 1))
    return past


def round_inputs(arm: Arm, round_: int, agents: pl.DataFrame, personas: pl.DataFrame) -> tuple[dict[str, Any], pl.DataFrame]:
    """The shared variables and agent frame of round ``round_``, as ``tasks.play`` builds them."""
    history = fake_history(round_, arm.rule)
    return seen(arm.rule, personas, round_, history, own_guesses=[h["winning_guess"] for h in history] if round_ > 1 else None, agents=agents)


# ------------------------------------------------------------------------------ tokens
class Counter:
    """Counts prompt tokens as the engine will (``EngineSpec.count_tokens``: llama.cpp's own
    vocabulary, the simulated engine's words), else ~4 characters a token; ``exact`` says which."""

    def __init__(self, spec: EngineSpec):
        self.spec = spec
        self.exact = spec.count_tokens([""]) is not None

    def __call__(self, texts: list[str]) -> np.ndarray:
        counts = self.spec.count_tokens(texts) if self.exact else None
        if counts is None:
            return np.array([len(t) / CHARS_PER_TOKEN for t in texts], dtype=np.float64)
        return np.asarray(counts, dtype=np.float64)


# ------------------------------------------------------------------------------ calibration
@dataclass
class Calibration:
    """What a few agents' round 1 on the real engine showed (per agent, both phases together)."""

    agents: int
    seconds_per_agent: float
    completion_tokens: float
    prompt_tokens: float  # as the engine counted them
    counted_prompt: float  # the same prompts (first phase) by ``Counter``
    #: The shard's wall seconds and, on the shared-context path, its distinct prompts, the
    #: tokens the engine evaluated for them (None where it does not count) and their trie's
    #: tokens (``Counter``'s count of the characters past each one's shared prefix).
    seconds: float = 0.0
    distinct: int = 0
    tokens_evaluated: int | None = None
    trie_tokens: float = 0.0
    #: On the shared-context path, an agent's seconds once its prompt's distribution is known.
    bookkeeping: float = 0.0
    #: On the shared-context path, the probabilities of one agent's answers (its calibration
    #: agents' round-1 distributions, pooled): what the plan draws histories from.
    answers: np.ndarray | None = None
    #: The fixed cost of a shard: an actor's seconds beyond its agents' (a one-agent shard whose
    #: prompt is answered already; 0 where each agent's own call dominates any shard) and the
    #: driver's seconds to commit one (0 without a committer).
    shard_s: float = 0.0
    commit_s: float = 0.0

    @property
    def node_tokens(self) -> float:
        """Tokens a distinct prompt costs beyond its trie edges (its answer tree, the re-evaluated
        start of its last block): what the calibration evaluated that its trie does not hold."""
        if not self.distinct or self.tokens_evaluated is None:
            return 0.0
        return max(0.0, (self.tokens_evaluated - self.trie_tokens) / self.distinct)


def calibrate(arm: Arm, seed: int, agents: pl.DataFrame, personas: pl.DataFrame, player: Any, counter: Counter,
              committer: Committer | None = None) -> Calibration:
    """Play round 1 of ``agents`` on the player's engine with their real prompts and seeds; with
    ``committer``, also time a shard's fixed costs (``shard_costs``)."""
    shared, frame = round_inputs(arm, 1, agents, personas)
    result = player.play_agents(arm, seed, 1, 0, frame, shared)
    g = result.guesses
    prompts = render(arm.mode.template, shared, agent_variables(frame))
    counted = counter(prompts)
    distinct = 0 if result.distributions is None else int(result.distributions["context"].n_unique())
    bookkeeping = 0.0
    if distinct and not arm.mode.reasoning:  # the same prompts for many agents: their distributions are kept
        copies = max(1, BOOKKEEPING_AGENTS // frame.height)
        offset = int(personas["agent_id"].max()) + 1
        many = pl.concat([frame.with_columns(pl.col("agent_id") + k * offset) for k in range(1, copies + 1)])
        bookkeeping = player.play_agents(arm, seed, 1, 1, many, shared).seconds / many.height
    shard_s, commit_s = shard_costs(arm, seed, frame, shared, player, result, committer, cached=bool(distinct) and not arm.mode.reasoning)
    return Calibration(g.height, float(g["latency_s"].mean()), float(g["completion_tokens"].mean()),
                       float(g["prompt_tokens"].mean()), float(counted.mean()), result.seconds, distinct,
                       result.tokens_evaluated, trie_chars(prompts) * tokens_per_char(prompts, counted), bookkeeping,
                       None if result.distributions is None else pooled_answers(result.distributions), shard_s, commit_s)


def shard_costs(arm: Arm, seed: int, frame: pl.DataFrame, shared: dict[str, Any], player: Any, result: Any,
                committer: Committer | None, cached: bool) -> tuple[float, float]:
    """A shard's fixed seconds, each the median of ``SHARD_REPEATS``: on the actor (a one-agent
    shard of a prompt already answered, where the engine keeps answers: ``cached``; elsewhere an
    agent's own call outweighs it, 0) and in the driver (``committer``: the calibration shard
    committed again under new shard numbers, after one commit that creates the scratch file)."""
    shard_s = 0.0
    if cached:
        one = frame.head(1)
        shard_s = float(np.median([_timed(lambda k=k: player.play_agents(arm, seed, 1, 2 + k, one, shared)) for k in range(SHARD_REPEATS)]))
    commit_s = 0.0
    if committer is not None:
        times = [committer(arm, 1, k, frame, result) for k in range(SHARD_REPEATS + 1)]
        commit_s = float(np.median(times[1:]))
    return shard_s, commit_s


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def with_shards(seconds: float, cfg, n: int, rounds: int, cal: Calibration) -> float:
    """``seconds`` of play plus what its shards cost (``Calibration.shard_s``, ``commit_s``).

    Actors pay ``shard_s`` per shard, side by side; the driver commits what has finished, about
    one shard per actor at a time (an actor holds two; the runs of 400 and 4,000 shards of 5 in
    docs/benchmarks.md took about one commit per actor's shard), so many small shards wait for
    it: a round takes the longer of the two, plus its last commit and the warehouse's two other
    visits (what is stored before it plays, its guesses after), each about a commit (opening the
    file is most of one)."""
    shards = math.ceil(n / shard_size(cfg))
    actors = pool_size(n, cfg.workers.actors, shard_size(cfg))
    driver = rounds * math.ceil(shards / actors) * cal.commit_s
    return max(seconds + rounds * shards * cal.shard_s / actors, driver) + rounds * 3 * cal.commit_s


def pooled_answers(distributions: pl.DataFrame) -> np.ndarray:
    """The probability of each answer of an agent drawn from ``distributions`` (rows of
    ``answer_distributions``: each context's answers, weighted by its agents)."""
    weights = (distributions.group_by("answer").agg((pl.col("probability") * pl.col("agents")).sum().alias("w"))
               .sort("answer")["w"].to_numpy())  # in a fixed order: the plan's draws are seeded
    return weights[weights > 0] / weights.sum()


# ------------------------------------------------------------------------------ shared prompts
def trie_chars(texts: Iterable[str]) -> int:
    """The characters of the trie of ``texts``: each distinct text's past the prefix it shares
    with the one before it, in sorted order (as the shared path evaluates them)."""
    total, previous = 0, ""
    for text in sorted(set(texts)):
        total += len(text) - len(os.path.commonprefix([previous, text]))
        previous = text
    return total


def tokens_per_char(texts: list[str], counted: np.ndarray) -> float:
    chars = sum(len(t) for t in texts)
    return float(np.sum(counted)) / chars if chars else 0.0


@dataclass
class SharedRound:
    """What the shared-context path evaluates in one round: distinct prompts and their tokens
    (trie and answer trees). Where agents are told their own guesses, ``at_most`` is the most
    prompts there can be and ``prompts`` what the calibration's answers make likely (the bound
    itself when there are none)."""

    prompts: float
    tokens: float
    at_most: float | None = None


def likely_prefixes(sizes: np.ndarray, answers: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Distinct histories of 1, 2, …, ``k`` own guesses among each persona's agents (``sizes``)
    when every guess is drawn from ``answers`` (one answer's probabilities), counted over one
    seeded draw of every agent's history (the same first guesses for every ``k``).

    The plan draws them from the calibration's round 1: later rounds' answers depend on what the
    agents are told, so this is an estimate (and the calibration's few agents pooled spread wider
    than each persona's own answers, on the side of more prompts)."""
    rng = np.random.default_rng(seed)
    history = np.repeat(np.arange(len(sizes), dtype=np.uint64), sizes.astype(np.int64))
    counts = []
    for _ in range(k):  # a hash of (persona, guesses so far): 64 bits, collisions negligible
        history = history * np.uint64(1_000_003) + rng.choice(len(answers), size=history.size, p=answers).astype(np.uint64)
        counts.append(np.unique(history).size)
    return np.array(counts, dtype=np.float64)


def shared_round(arm: Arm, round_: int, personas: pl.DataFrame, counter: Counter, scale: float, node_tokens: float,
                 answers: np.ndarray | None = None, seed: int = 0) -> SharedRound:
    """Round ``round_``'s distinct prompts and tokens on the shared-context path.

    Agents with equal template variables share a prompt: the personas that give distinct
    prompts are counted over the whole population and up to ``TRIE_SAMPLE`` of them rendered for
    the trie's size (a sample of a larger set overstates it: its prompts are further apart). With
    own guesses shown, a persona's prompts branch at each shown guess: the trie holds the text
    from the j-th guess to the next once per distinct history of j guesses — at most one per
    persona and possible history (or per agent of it); with ``answers`` (one answer's
    probabilities), as many as ``likely_prefixes`` draws. Each prompt past its persona's first
    also evaluates again the start of the block where it leaves the one before it
    (``EngineSpec.prefix_block``).
    """
    template = arm.mode.template
    groups = distinct_agents(template, agent_variables(personas))
    reps, sizes = groups["row"].to_list(), groups["agents"].to_numpy()
    picked = personas[[reps[i] for i in np.unique(np.linspace(0, len(reps) - 1, min(len(reps), TRIE_SAMPLE)).astype(np.int64))]]
    shared, frame = round_inputs(arm, round_, picked, personas)
    texts = render(template, shared, agent_variables(frame))
    per_char = tokens_per_char(texts, counter(texts)) * scale
    persona_tokens = trie_chars(texts) * per_char * len(reps) / len(set(texts))
    k = arm.rule.history.own_guesses_in(round_)
    if k == 0:
        return SharedRound(len(reps), persona_tokens + len(reps) * node_tokens)
    rule = arm.rule
    values = rule.high - rule.low + 1 if rule.integer else math.inf
    # Distinct histories of 1…k guesses: each persona's agents, or its possible histories.
    bound = np.array([np.minimum(sizes, float(values) ** j).sum() for j in range(1, k + 1)], dtype=np.float64)
    prefixes = bound if answers is None else np.minimum(bound, likely_prefixes(sizes, answers, k, seed))
    # The text of a prompt from its j-th guess on: where the same agent told another j-th guess leaves it.
    first = frame.head(1)
    a = render(template, shared, agent_variables(first))[0]
    tails = []
    for j in range(k):
        guesses = first["own_guesses"][0].to_list()
        guesses[j] = rule.low if guesses[j] != rule.low else rule.high
        other = first.with_columns(own_guesses=pl.Series([guesses], dtype=first.schema["own_guesses"]))
        tails.append(len(a) - len(os.path.commonprefix([a, render(template, shared, agent_variables(other))[0]])))
    segments = -np.diff([*tails, 0]) * per_char  # from the j-th guess to the next (the last: to the end)
    # One prompt of each persona is in the trie already; every further history adds its segments.
    further = np.maximum(0.0, prefixes - len(reps))
    prompts = float(prefixes[-1])
    block = (arm.engine.prefix_block - 1) / 2
    tokens = persona_tokens + float(np.sum(further * segments)) + further[-1] * block + prompts * node_tokens
    return SharedRound(prompts, tokens, float(bound[-1]))


# ------------------------------------------------------------------------------ requests
#: The two ways an HTTP engine can send an arm's calls (``request_rows``).
PER_AGENT, PER_PROMPT = "per agent", "per prompt"


def shard_prompt_sizes(arm: Arm, personas: pl.DataFrame, size: int) -> np.ndarray:
    """How many agents share each distinct first-round prompt within each shard of ``size`` (agents
    in population order, as ``tasks.play`` cuts them): the groups an engine that batches by prompt
    sees (``engines.shared_context.prompt_groups``)."""
    keys = prompt_keys(arm.mode.template, agent_variables(personas))
    shards = pl.Series(np.arange(personas.height) // size)
    if keys is None:
        return shards.value_counts()["count"].to_numpy()
    return pl.DataFrame({"shard": shards, "key": keys}).group_by("shard", "key").len()["len"].to_numpy()


def batched_requests(sizes: np.ndarray, per_request: int, own_guesses: int, values: float) -> tuple[int, bool]:
    """Requests for groups of ``sizes`` agents sharing a prompt, ``per_request`` agents a request,
    and whether that is a bound: with ``own_guesses`` shown, a group's agents hold at most
    D = min(size, values ** own_guesses) distinct prompts, which take at most D + (size − D) / n
    requests (each prompt's ceil(m / n) ≤ (m + n − 1) / n)."""
    sizes = sizes.astype(np.float64)
    if own_guesses == 0:
        return int(np.sum(np.ceil(sizes / per_request))), False
    distinct = np.minimum(sizes, values ** min(own_guesses, 64))
    return int(np.sum(np.minimum(sizes, np.floor(distinct + (sizes - distinct) / per_request)))), True


def request_rows(arm: Arm, spec: EngineSpec, sizes: np.ndarray, prompts: list[float], completion: tuple[float, float],
                 second_prompt: float) -> list[dict[str, Any]]:
    """Each round and phase of an arm on an HTTP engine both ways: ``PER_AGENT`` (a request per
    agent) and ``PER_PROMPT`` (the agents of a shard that share a prompt answered by
    ``batched_choices`` completions a request: billed one prompt a request, every agent's completion).

    Args:
        sizes: agents per shard and distinct first-round prompt (``shard_prompt_sizes``).
        prompts: each round's first-phase prompt tokens per agent.
        completion: completion tokens per agent of the first phase and of the answer after reasoning.
        second_prompt: the answer phase's prompt tokens beyond the first phase's (reasoning and cue).
    """
    n, per_request = int(sizes.sum()), spec.batched_choices or 1
    rule = arm.rule
    values = rule.high - rule.low + 1 if rule.integer else math.inf
    rows = []

    def add(round_: int, phase: str, way: str, requests: int, at_most: bool, prompt: float, completion_: float) -> None:
        rows.append({"round": round_, "phase": phase, "way": way, "requests": requests, "at_most": at_most,
                     "prompt_tokens": _round(requests * prompt), "completion_tokens": _round(n * completion_),
                     "cost": spec.price(requests * prompt, n * completion_)})

    for round_, prompt in enumerate(prompts, start=1):
        first = "reasoning" if arm.mode.reasoning else "answer"
        batched, bound = batched_requests(sizes, per_request, rule.history.own_guesses_in(round_), values)
        add(round_, first, PER_AGENT, n, False, prompt, completion[0])
        add(round_, first, PER_PROMPT, batched, bound, prompt, completion[0])
        if arm.mode.reasoning:  # each agent's answer follows its own reasoning: agents rarely share it
            for way in (PER_AGENT, PER_PROMPT):
                add(round_, "answer", way, n, way == PER_PROMPT, prompt + second_prompt, completion[1])
    return rows


def request_totals(rows: list[dict[str, Any]], way: str) -> tuple[float, float, float | None]:
    """Prompt tokens, completion tokens and cost of one way over an arm's rounds and phases."""
    mine = [r for r in rows if r["way"] == way]
    costs = [r["cost"] for r in mine]
    return (float(sum(r["prompt_tokens"] for r in mine)), float(sum(r["completion_tokens"] for r in mine)),
            None if None in costs else float(sum(costs)))


# ------------------------------------------------------------------------------ the plan
def plan(cfg: ExperimentConfig, player_for: Callable[[EngineSpec], Player], samples: int = SAMPLE, calibration: int = CALIBRATE,
         calls_per_second: float | None = None, say=lambda text: None, committer: Committer | None = None) -> list[ArmPlan]:
    """The estimate of every arm of ``cfg`` (see the module docstring).

    Args:
        cfg: the experiment.
        player_for: a player of an engine spec in this process (``tasks.actor.ShardPlayer``), built
            once per engine for the calibration.
        samples: agents whose prompts are rendered and counted.
        calibration: agents that play round 1 on each engine (0: no calibration; completion
            tokens are then their maxima and time is unknown unless ``calls_per_second``).
        calls_per_second: the user's own throughput figure for the whole run, used for time.
        say: called with a line before each slow step (building an engine, calibrating).
        committer: commits a calibration shard to a scratch warehouse, to time a shard's commit
            (``cli.plan``); None: commits are not counted.
    """
    personas = sample(cfg.population.load(), cfg.population.size, cfg.seed)
    if cfg.groups is not None:
        personas = personas.with_columns(cfg.groups.assign(personas, cfg.seed))
    if any(a.mode.needs_backstory for a in cfg.arms_list()) and "background" not in personas.columns:
        personas = backstory_placeholder(personas, cfg.population.backstories.max_tokens)
    picked = sample_agents(personas, samples)
    players: dict[str, Any] = {}
    nodes: dict[str, float] = {}  # answer-tree tokens a prompt, by engine: from its first arm's calibration
    out = []
    try:
        for arm in cfg.arms_list():
            out.append(_arm_plan(cfg, arm, personas, picked, calibration, calls_per_second, players, nodes, say, player_for, committer))
    finally:
        for player in players.values():
            player.close()
    return out


def _arm_plan(cfg, arm: Arm, personas, picked, calibration, calls_per_second, players, nodes, say, player_for, committer=None) -> ArmPlan:
    n, rounds, phases = personas.height, arm.rule.rounds, 2 if arm.mode.reasoning else 1
    calls = n * rounds * phases
    if isinstance(arm.engine, MixtureSpec):
        seconds = calls / calls_per_second if calls_per_second else None
        return ArmPlan(arm, n, rounds, phases, None, None, seconds, None, "mixture: calls only")
    spec = arm.engine
    batched = (spec.batched_choices or 1) > 1 and not spec.uses_shared_context
    cal: Calibration | None = None
    engine = None
    if calibration > 0:
        if spec.key not in players:
            say(f"arm {arm.index}: starting {spec.kind} ({spec.model_name}) to calibrate on {min(calibration, n)} agent(s)")
            # An engine that batches requests calibrates one request per agent: each agent's own tokens.
            players[spec.key] = player_for(spec.model_copy(update={"completions_per_request": 1}) if batched else spec)
        engine = players[spec.key].engine
    counter = Counter(spec)
    if engine is not None:
        cal = calibrate(arm, cfg.seed, sample_agents(personas, calibration), personas, players[spec.key], counter, committer)
    # The counter's scale against the engine's own count (characters → tokens for HTTP engines).
    scale = 1.0 if counter.exact or cal is None or not cal.counted_prompt else cal.prompt_tokens / phases / cal.counted_prompt
    cue = float(counter([FINAL_CUE])[0]) if phases == 2 else 0.0
    if cal is not None:
        completion = cal.completion_tokens
        # A second phase's prompt is the first one + the reasoning + the cue: the calibration's
        # own count minus two first prompts is that reasoning and cue.
        second_extra = max(0.0, cal.prompt_tokens - 2 * cal.counted_prompt * scale) if phases == 2 else 0.0
    else:
        completion = arm.max_answer_tokens + (arm.max_reasoning_tokens if phases == 2 else 0)
        second_extra = arm.max_reasoning_tokens + cue
    prompt = 0.0
    firsts = []
    for round_ in range(1, rounds + 1):
        shared, frame = round_inputs(arm, round_, picked, personas)
        firsts.append(counter(render(arm.mode.template, shared, agent_variables(frame))).mean() * scale)
        prompt += n * (firsts[-1] if phases == 1 else 2 * firsts[-1] + second_extra)
    completion_total = n * rounds * completion
    seconds = _seconds(spec, cfg, n, rounds, phases, cal, calls_per_second)
    cost = spec.price(prompt, completion_total)
    requests = None
    if batched:
        reasoning = max(0.0, second_extra - cue) if phases == 2 else 0.0
        split = (reasoning, max(0.0, completion - reasoning)) if phases == 2 else (completion, 0.0)
        requests = request_rows(arm, spec, shard_prompt_sizes(arm, personas, shard_size(cfg)), firsts, split, second_extra)
        prompt, completion_total, cost = request_totals(requests, PER_PROMPT)
    distinct: float | None = None
    at_most: float | None = None
    if cal is not None:
        basis = f"calibrated on {cal.agents} agent(s)" + ("" if counter.exact else ", tokens ~4 characters each")
        if not calls_per_second:
            basis += f", {math.ceil(n / shard_size(cfg)):,} shard(s) a round"
        if cal.distinct and phases == 1 and not calls_per_second:
            # An engine calibrated for an earlier arm still holds that arm's prompt: a later arm's
            # evaluates less than its trie, and its answer trees cost what the first arm's did.
            node_tokens = nodes.setdefault(spec.key, cal.node_tokens)
            work = [shared_round(arm, r, personas, counter, scale, node_tokens, cal.answers, cfg.seed) for r in range(1, rounds + 1)]
            distinct = sum(w.prompts for w in work)
            seconds = _shared_seconds(cfg, n, work, cal)
            if any(w.at_most is not None for w in work):
                at_most = sum(w.prompts if w.at_most is None else w.at_most for w in work)
                likely = cal.answers is not None and round(distinct) < round(at_most)
                basis += f"; about {distinct:,.0f} distinct prompts (at most {at_most:,.0f})" if likely else f"; at most {at_most:,.0f} distinct prompts"
            else:
                basis += f"; {distinct:,.0f} distinct prompts"
        if seconds is not None and not calls_per_second:
            seconds = with_shards(seconds, cfg, n, rounds, cal)
    else:
        basis = "completion tokens at their maxima" + ("; time from --calls-per-second" if calls_per_second else "")
    if batched:
        basis += f"; agents of a shard that share a prompt: {spec.batched_choices} completions a request"
    return ArmPlan(arm, n, rounds, phases, prompt, completion_total, seconds, cost, basis, distinct, at_most, requests)


def _shared_seconds(cfg, n: int, work: list[SharedRound], cal: Calibration) -> float:
    """The shared-context path's time: every round's tokens at the calibration's seconds a token
    (or its prompts at its seconds a prompt, on an engine that does not count tokens), plus every
    agent's own part (drawing, parsing: ``Calibration.bookkeeping``), shared out over the actors
    (each distinct prompt is computed once for the pool)."""
    actors = pool_size(n, cfg.workers.actors, shard_size(cfg))
    agents = n * len(work) * cal.bookkeeping
    if cal.tokens_evaluated:
        return (sum(w.tokens for w in work) * cal.seconds / cal.tokens_evaluated + agents) / actors
    return (sum(w.prompts for w in work) * cal.seconds / cal.distinct + agents) / actors


def _seconds(spec: EngineSpec, cfg, n: int, rounds: int, phases: int, cal: Calibration | None, calls_per_second: float | None) -> float | None:
    """From the user's calls per second, else the engine's own prediction (``EngineSpec.predicted_seconds``)."""
    if calls_per_second:
        return n * rounds * phases / calls_per_second
    actors = min(cfg.workers.actors, math.ceil(n / shard_size(cfg)))
    if cal is None:
        return spec.predicted_seconds(n, rounds, phases, actors, None, None)
    return spec.predicted_seconds(n, rounds, phases, actors, cal.seconds_per_agent, cal.prompt_tokens + cal.completion_tokens,
                                  cal.seconds / cal.agents if cal.seconds and cal.agents else None)
