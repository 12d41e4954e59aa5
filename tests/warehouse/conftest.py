"""A warehouse filled through the real store API with seeded answers, invalid ones included.

Three arms (two prompt modes, two fixture models, two rules) × three rounds over 400 personas
with education, gender, occupation and a numeric age. Answers are raw texts parsed by the real
answer parser, so some are invalid for the reasons a model's answers would be.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from core.game import GameRule, outcome
from prompts.answers import parse_answers
from warehouse.store import RunRow, ShardRecord, Warehouse

EXPERIMENT = "views-0001"
N = 400
ROUNDS = 3
ARMS = [
    # arm, prompt mode, model, rule
    (0, "basic", "fixture/a", GameRule(ratio="2/3", rounds=ROUNDS)),
    (1, "cot", "fixture/a", GameRule(ratio="2/3", rounds=ROUNDS)),
    (2, "basic", "fixture/b", GameRule(ratio="1/2", offset=5, rounds=ROUNDS)),
]
GARBAGE = ["about fifty", "150", "12 or 13", "33.5", ""]


def personas(rng: np.random.Generator) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "agent_id": np.arange(N, dtype=np.int64),
            "education": rng.choice(["High School", "Bachelor's Degree", "Ph.D."], N),
            "gender": rng.choice(["female", "male"], N),
            "occupation": rng.choice(["teacher", "engineer", "farmer", "nurse"], N),
            "age": rng.integers(18, 90, N),
        }
    )


def answers(rng: np.random.Generator, centre: float) -> list[str]:
    values = np.clip(np.round(rng.normal(centre, 15, N)), 0, 100).astype(int).astype(str)
    garbage = rng.random(N) < 0.06
    picks = rng.choice(GARBAGE, N)
    return [g if bad else v for v, bad, g in zip(values, garbage, picks)]


def fill(path, arms: list = ARMS, rounds: int = ROUNDS) -> Warehouse:
    rng = np.random.default_rng(2026)
    wh = Warehouse(path)
    wh.begin_experiment(EXPERIMENT, "views", {"name": "views"}, "0001", 1, N)
    wh.write_personas(EXPERIMENT, personas(rng))
    for arm, mode, model, rule in arms:
        run_id = f"{EXPERIMENT}-arm{arm}"
        wh.begin_run(RunRow(
            run_id=run_id, experiment_id=EXPERIMENT, arm=arm, engine="fixture", model=model,
            prompt_mode=mode, temperature=0.7, ratio=rule.ratio, ratio_value=float(rule.fraction),
            offset=rule.offset, low=rule.low, high=rule.high, answers=rule.answers,
            tolerance=rule.tolerance, rounds=rule.rounds, equilibrium=rule.equilibrium,
            spec={"kind": "fixture"},
        ))
        centre = 50.0 - 5 * arm
        for round_ in range(1, rounds + 1):
            raw = answers(rng, centre)
            parsed = parse_answers(pl.Series(raw, dtype=pl.String), rule.low, rule.high, rule.integer)
            guesses = pl.DataFrame({
                "run_id": run_id, "round": round_, "agent_id": np.arange(N, dtype=np.int64), "shard": 0,
                "engine": "fixture", "model": model, "guess": parsed["guess"], "valid": parsed["valid"],
                "raw": raw, "reasoning": None if mode == "basic" else "thinking",
                "prompt_tokens": rng.integers(50, 120, N), "completion_tokens": rng.integers(1, 40, N),
                "latency_s": rng.gamma(2.0, 0.1, N), "attempts": rng.choice([1, 1, 1, 2], N), "error": parsed["error"],
            })
            wh.write_shards([ShardRecord(guesses, run_id, round_, shard=0, n=N, node="local", worker="w", seconds=0.5)])
            result = outcome(guesses.select("agent_id", "guess", "valid"), rule)
            wh.write_outcome(run_id, round_, result, 1.25)
            centre = result.target
        wh.finish_run(run_id)
    wh.finish_experiment(EXPERIMENT)
    return wh


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Warehouse:
    return fill(tmp_path_factory.mktemp("views") / "views.duckdb")
