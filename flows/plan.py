"""``keynes plan``: what an experiment will cost before anything runs.

Per arm: LLM calls (agents × rounds × phases, exact), prompt and completion tokens (the real
prompts of a sample of agents, rendered for every round and counted with the engine's own
tokenizer), time and, when the engine config names prices, cost. Time and completion tokens
come from a short calibration: a few sampled agents play round 1 on the configured engine,
in this process, with their real prompts and seeds. Nothing is written to the warehouse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from engines import EngineSpec
from engines.mixture import MixtureSpec
from flows.config import ExperimentConfig
from populations.sampler import sample
from prompts.context import agent_variables, round_variables, shown_own_guesses
from prompts.modes import FINAL_CUE
from prompts.render import render
from tasks.arms import Arm

#: Agents whose prompts are rendered and counted (evenly spread over the population).
SAMPLE = 24
#: Agents that play round 1 on the real engine to calibrate time and completion tokens.
CALIBRATE = 3
#: Characters per token where no tokenizer is at hand (OpenAI's rule of thumb for English).
CHARS_PER_TOKEN = 4.0


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
            "basis": self.basis,
        }


def _round(value: float | None) -> int | None:
    return None if value is None else int(round(value))


# ------------------------------------------------------------------------------ prompts
def sample_agents(personas: pl.DataFrame, k: int) -> pl.DataFrame:
    """``k`` agents spread evenly over the population (all of them when it is smaller)."""
    if personas.height <= k:
        return personas
    return personas[np.unique(np.linspace(0, personas.height - 1, k).astype(np.int64)).tolist()]


def fake_history(round_: int, rule: Any) -> list[dict[str, Any]]:
    """Outcomes of the rounds before ``round_`` as a prompt shows them, with plausible numbers
    (the mean shrinking by the ratio each round): only their length matters here."""
    mean = (rule.low + rule.high) / 2
    past = []
    for r in range(1, round_):
        mean *= float(rule.fraction)
        past.append({"round": r, "n": 0, "n_valid": 0, "mean": mean, "median": mean, "target": mean * float(rule.fraction),
                     "winning_guess": mean * float(rule.fraction), "n_winners": 1})
    return past


def round_inputs(arm: Arm, round_: int, agents: pl.DataFrame, personas: pl.DataFrame) -> tuple[dict[str, Any], pl.DataFrame]:
    """The shared variables and agent frame of round ``round_``, as ``tasks.play`` builds them."""
    history = fake_history(round_, arm.rule)
    shared = round_variables(arm.rule, personas, round_, history)
    if round_ > 1:
        own = [[h["winning_guess"] for h in history]] * agents.height
        agents = shown_own_guesses(agents.with_columns(own_guesses=pl.Series(own, dtype=pl.List(pl.Float64))), arm.rule.history)
    return shared, agents


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


def calibrate(arm: Arm, seed: int, agents: pl.DataFrame, personas: pl.DataFrame, player: Any, counter: Counter) -> Calibration:
    """Play round 1 of ``agents`` on the player's engine with their real prompts and seeds."""
    from tasks.actor import ShardJob

    shared, frame = round_inputs(arm, 1, agents, personas)
    result = player.play(ShardJob(arm, seed, 1, 0, frame, shared))
    g = result.guesses
    prompts = render(arm.mode.template, shared, agent_variables(frame))
    return Calibration(g.height, float(g["latency_s"].mean()), float(g["completion_tokens"].mean()),
                       float(g["prompt_tokens"].mean()), float(counter(prompts).mean()))


# ------------------------------------------------------------------------------ the plan
def plan(cfg: ExperimentConfig, samples: int = SAMPLE, calibration: int = CALIBRATE,
         calls_per_second: float | None = None, say=lambda text: None) -> list[ArmPlan]:
    """The estimate of every arm of ``cfg`` (see the module docstring).

    Args:
        cfg: the experiment.
        samples: agents whose prompts are rendered and counted.
        calibration: agents that play round 1 on each engine (0: no calibration; completion
            tokens are then their maxima and time is unknown unless ``calls_per_second``).
        calls_per_second: the user's own throughput figure for the whole run, used for time.
        say: called with a line before each slow step (building an engine, calibrating).
    """
    personas = sample(cfg.population.load(), cfg.population.size, cfg.seed)
    if cfg.groups is not None:
        personas = personas.with_columns(cfg.groups.assign(personas, cfg.seed))
    picked = sample_agents(personas, samples)
    if any(a.mode.needs_backstory for a in cfg.arms_list()) and "background" not in picked.columns:
        # Backstories are written by an LLM at run time: count a placeholder of their budget.
        words = " ".join(["word"] * cfg.population.backstories.max_tokens)
        personas = personas.with_columns(background=pl.lit(words))
        picked = picked.with_columns(background=pl.lit(words))
    players: dict[str, Any] = {}
    out = []
    try:
        for arm in cfg.arms_list():
            out.append(_arm_plan(cfg, arm, personas, picked, calibration, calls_per_second, players, say))
    finally:
        for player in players.values():
            player.close()
    return out


def _arm_plan(cfg, arm: Arm, personas, picked, calibration, calls_per_second, players, say) -> ArmPlan:
    n, rounds, phases = personas.height, arm.rule.rounds, 2 if arm.mode.reasoning else 1
    calls = n * rounds * phases
    if isinstance(arm.engine, MixtureSpec):
        seconds = calls / calls_per_second if calls_per_second else None
        return ArmPlan(arm, n, rounds, phases, None, None, seconds, None, "mixture: calls only")
    spec = arm.engine
    cal: Calibration | None = None
    engine = None
    if calibration > 0:
        if spec.key not in players:
            from tasks.actor import ShardPlayer

            say(f"arm {arm.index}: starting {spec.kind} ({spec.model_name}) to calibrate on {min(calibration, n)} agent(s)")
            players[spec.key] = ShardPlayer(spec)
        engine = players[spec.key].engine
    counter = Counter(spec)
    if engine is not None:
        cal = calibrate(arm, cfg.seed, sample_agents(personas, calibration), personas, players[spec.key], counter)
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
    for round_ in range(1, rounds + 1):
        shared, frame = round_inputs(arm, round_, picked, personas)
        first = counter(render(arm.mode.template, shared, agent_variables(frame))).mean() * scale
        prompt += n * (first if phases == 1 else 2 * first + second_extra)
    completion_total = n * rounds * completion
    seconds = _seconds(spec, cfg, n, rounds, phases, cal, calls_per_second)
    cost = spec.price(prompt, completion_total)
    if cal is not None:
        basis = f"calibrated on {cal.agents} agent(s)" + ("" if counter.exact else ", tokens ~4 characters each")
    else:
        basis = "completion tokens at their maxima" + ("; time from --calls-per-second" if calls_per_second else "")
    return ArmPlan(arm, n, rounds, phases, prompt, completion_total, seconds, cost, basis)


def _seconds(spec: EngineSpec, cfg, n: int, rounds: int, phases: int, cal: Calibration | None, calls_per_second: float | None) -> float | None:
    """From the user's calls per second, else the engine's own prediction (``EngineSpec.predicted_seconds``)."""
    if calls_per_second:
        return n * rounds * phases / calls_per_second
    actors = min(cfg.workers.actors, math.ceil(n / cfg.workers.shard_size))
    per_agent, tokens = (cal.seconds_per_agent, cal.prompt_tokens + cal.completion_tokens) if cal else (None, None)
    return spec.predicted_seconds(n, rounds, phases, actors, per_agent, tokens)
