"""What the exact-over-HTTP tests share (tests/engines/test_openai_vllm.py, test_openai_llamacpp.py): the
20 prompts and three chains they compare on, the distance between two answer distributions, and a
served config played through the flow in two layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling
from prompts.context import game_context
from prompts.render import render

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
PLAYERS = [5, 30, 100, 1000]
CONSTRAINT = Constraint(0, 100, True)
#: Three sampling chains: the default, greedy, and nucleus without top-k or repeat penalty.
CHAINS = {
    "default": Sampling(0.7, 8),
    "temperature 0": Sampling(0.0, 8),
    "top_k 0, top_p 0.9, repeat_penalty 1": Sampling(0.7, 8, top_p=0.9, top_k=0, min_p=0.05, repeat_penalty=1.0),
}
#: Two layouts of the same run: one actor playing whole rounds, two actors on shards of 4.
ONE, TWO = (1, 500), (2, 4)
#: A served run's direct-mode guesses, in a fixed order.
BASIC = """select g.round, g.agent_id, g.raw, g.guess, g.completion_tokens, g.prompt_tokens, g.context
           from guesses g join runs r using (run_id) where r.prompt_mode = 'basic' order by g.round, g.agent_id"""


def prompts() -> list[str]:
    """20 distinct round-1 prompts: five education levels × four game sizes."""
    out: list[str] = []
    for n in PLAYERS:
        shared = {"game": game_context(GameRule(), n), "round": 1, "history": []}
        out += render("basic.j2", shared, pl.DataFrame({"persona": [{"education": e} for e in EDUCATION]}))
    assert len(set(out)) == len(out) == 20
    return out


def batch(texts: list[str], sampling: Sampling, seeds: np.ndarray | None = None, constraint: Constraint = CONSTRAINT) -> RequestBatch:
    seeds = np.arange(len(texts)) * 7919 + 11 if seeds is None else seeds
    return RequestBatch(np.arange(len(texts)), texts, seeds, sampling, constraint)


def by_prompt(out, texts: list[str]) -> dict[str, dict[str, float]]:
    """Each prompt's answer distribution (answer → probability) in a completed batch."""
    found = {c: dict(zip(g["answer"], g["probability"])) for (c,), g in out.distributions.group_by("context")}
    return {t: found[c] for t, c in zip(texts, out.context)}


def tvd(p: dict[str, float], q_: dict[str, float]) -> float:
    return 0.5 * sum(abs(p.get(a, 0.0) - q_.get(a, 0.0)) for a in set(p) | set(q_))


def answer_over_http(spec: dict, constraint: Constraint = CONSTRAINT) -> tuple[dict, tuple[int, int, int]]:
    """Every chain's batch of the 20 prompts, answers within ``constraint``, through the openai engine's
    exact path: (completions by chain, (``/tokenize`` requests, node requests, tree nodes))."""
    from engines import build_engine, parse_spec

    engine = build_engine(parse_spec(spec))
    try:
        texts = prompts()
        out = {name: engine.generate(batch(texts, s, constraint=constraint)) for name, s in CHAINS.items()}
        exact = engine._exact
        return out, (exact.tokenized, exact.steps, exact.nodes)
    finally:
        engine.close()


def compare(out: dict, reference: dict, max_tvd: float, same_guesses: tuple[str, ...] = tuple(CHAINS)) -> None:
    """Each chain's distributions over HTTP (``out``) against in process (``reference``), 20 prompts:
    complete, shared, summing to 1, within ``max_tvd``, greedy a single answer, and the same guesses
    under the chains named in ``same_guesses``."""
    texts = prompts()
    worst = {}
    for name in CHAINS:
        ours, theirs = by_prompt(out[name], texts), by_prompt(reference[name], texts)
        distances = [tvd(ours[t], theirs[t]) for t in texts]
        worst[name] = max(distances)
        print(f"\n{name:40s} TVD over HTTP vs in process, 20 prompts: max {max(distances):.2e}, mean {np.mean(distances):.2e}")
        assert out[name].error == [None] * 20 and out[name].shared_prompt.all()
        sums = out[name].distributions.group_by("context").agg(pl.col("probability").sum())
        assert (sums["probability"] - 1).abs().max() < 1e-9
    assert max(worst.values()) < max_tvd, worst
    assert all(len(d) == 1 for d in by_prompt(out["temperature 0"], texts).values())
    for name in same_guesses:  # same distributions, same seeds: the same guesses
        assert out[name].text == reference[name].text, name


def play_layouts(config: Path, served: list[str], root: Path, agents: int) -> dict[tuple[int, int], Path]:
    """``config`` through the real flow with ``served`` overrides (the server's address), at a tiny
    size, in both layouts (``ONE`` also reasons, as shipped; ``TWO`` plays the direct mode): each
    layout's warehouse."""
    from flows.experiment import experiment
    from tasks.pool import shutdown_pools

    out = {}
    for (actors, shard_size), modes in ((ONE, "[basic, cot]"), (TWO, "[basic]")):
        path = root / f"a{actors}-s{shard_size}.duckdb"
        overrides = [*served, f"population.size={agents}", "game.rounds=2", "arms.max_reasoning_tokens=8", f"arms.prompts={modes}",
                     f"workers.actors={actors}", f"workers.shard_size={shard_size}", "report.enabled=false"]
        summary = experiment(str(config), overrides, db=str(path))
        shutdown_pools()
        assert summary.complete
        out[(actors, shard_size)] = path
    return out
