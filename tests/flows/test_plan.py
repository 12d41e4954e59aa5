"""`keynes plan`: calls per arm exactly, tokens within 20 % of what a real run stores, and
nothing written before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import QUICKSTART, QUICKSTART_AGENTS, QUICKSTART_OVERRIDES, QUICKSTART_ROUNDS, REPO
from tests.support.sql import q


def keynes(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=None if env is None else os.environ | env)


def sets(overrides: list[str]) -> list[str]:
    return [part for o in overrides for part in ("--set", o)]


@pytest.mark.llm
@pytest.mark.slow
def test_the_plan_of_the_quickstart_matches_a_real_run(tmp_path, quickstart):
    """The plan of the session's quickstart run (10 agents × 2 rounds × basic: 1 phase, cot: 2
    phases) against the tokens that run stored."""
    db, _ = quickstart
    planned_db = tmp_path / "plan.duckdb"
    result = keynes("plan", str(QUICKSTART), *sets(QUICKSTART_OVERRIDES + [f"db={planned_db}"]), "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = {r["prompt_mode"]: r for r in json.loads(result.stdout)}
    assert not planned_db.exists()  # a plan writes nothing
    per_arm = QUICKSTART_AGENTS * QUICKSTART_ROUNDS  # guesses
    assert {mode: r["calls"] for mode, r in rows.items()} == {"basic": per_arm, "cot": per_arm * 2}
    assert all(r["seconds"] and r["seconds"] > 0 for r in rows.values())

    stored = q(db, "select r.prompt_mode, sum(g.prompt_tokens), sum(g.completion_tokens), count(*) "
                   "from guesses g join runs r using (run_id) group by 1")
    assert {mode for mode, *_ in stored} == set(rows)
    for mode, prompt_tokens, completion_tokens, guesses in stored:
        assert guesses == per_arm
        plan = rows[mode]
        assert plan["prompt_tokens"] == pytest.approx(prompt_tokens, rel=0.2), (mode, plan, prompt_tokens)
        assert plan["completion_tokens"] == pytest.approx(completion_tokens, rel=0.2), (mode, plan, completion_tokens)
    # Chain of thought decodes a shard's agents together: its time is the shards' (over the run's 2
    # actors), not each agent's latency times the agents (the plan times the calibration shard's
    # wall). Planned / played: 1.4 on a quiet machine; the band leaves room for a busy one.
    (played,) = q(db, "select sum(s.seconds) / 2 from shards s join runs r using (run_id) where r.prompt_mode = 'cot'")[0]
    assert 0.3 <= rows["cot"]["seconds"] / played <= 3.0, (rows["cot"], played)


def test_the_plan_table_of_a_simulated_experiment(tmp_path):
    config = tmp_path / "sim.yaml"
    config.write_text(
        "name: 'planned [v2]'\npopulation: {size: 1000}\ngame: {rounds: 3}\n"
        "arms: {engines: [{kind: simulated, latency_s: 1.0, concurrency: 100}], prompts: [basic, cot]}\n"
        f"workers: {{actors: 2, shard_size: 250}}\ndb: {tmp_path / 'never.duckdb'}\n"
    )
    result = keynes("plan", str(config), "--calibrate", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    # 1,000 agents × 3 rounds × 1 or 2 phases; waves of 2 actors × 100 at 1 s each.
    assert [(r["calls"], r["seconds"]) for r in rows] == [(3000, 15.0), (6000, 30.0)]
    assert not (tmp_path / "never.duckdb").exists()
    table = keynes("plan", str(config), "--calibrate", "0", env={"COLUMNS": "80"})
    assert table.returncode == 0 and "6,000" in table.stdout and "calls" in table.stdout
    lines = table.stdout.splitlines()
    # an 80-column terminal holds every line whole; each arm's basis is a line of its own below
    assert max(map(len, lines)) <= 80 and "…" not in table.stdout, table.stdout
    assert lines[0].strip().startswith("planned [v2] (planned [v2]-"), lines[0]  # the name as written, no markup
    assert "arm 0: completion tokens at their maxima" in lines and "arm 1: completion tokens at their maxima" in lines, lines
    assert "cost" not in table.stdout  # no engine has prices: no column of dashes
    bad = keynes("plan", str(config), "--set", "population.size=-1")
    assert bad.returncode == 2 and "population.size" in bad.stderr


def test_the_plan_table_shows_cost_where_an_engine_has_prices(tmp_path):
    config = tmp_path / "priced.yaml"
    config.write_text(
        "name: priced\npopulation: {size: 100}\n"
        "arms: {engines: [{kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m, prompt_price_per_million: 2.0,"
        " completion_price_per_million: 8.0}], prompts: [basic]}\n"
        f"db: {tmp_path / 'never.duckdb'}\n"
    )
    result = keynes("plan", str(config), "--calibrate", "0", "--calls-per-second", "10", "--format", "json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["cost"] > 0 and row["seconds"] == row["calls"] / 10, row
    table = keynes("plan", str(config), "--calibrate", "0", "--calls-per-second", "10", env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "cost" in table.stdout and f"{row['cost']:,.4f}" in table.stdout, table.stdout
    assert max(map(len, table.stdout.splitlines())) <= 80 and "…" not in table.stdout, table.stdout
    assert " all " not in table.stdout  # one arm: no total row


@pytest.mark.llm
@pytest.mark.slow
def test_on_the_shared_path_time_follows_the_distinct_prompts_not_the_agents(tmp_path):
    """100,000 Gemma agents of 5 personas, 2 rounds, basic: the shared-context path answers each
    distinct prompt once, so the plan counts prompts (5 a round without own guesses; with them, as
    many first guesses as the calibration's answers make likely, at most one per persona and
    possible first guess in round 2) and its time is theirs, not 200,000
    agents' (the per-agent calibration alone would say hours)."""
    config = tmp_path / "shared.yaml"
    config.write_text(
        "name: planned-shared\npopulation: {spec: education.yaml, size: 100000}\ngame: {rounds: 2}\n"
        "arms: {engines: [{kind: llamacpp}], prompts: [basic]}\n"
        f"workers: {{actors: 2, shard_size: 10000}}\ndb: {tmp_path / 'never.duckdb'}\n"
    )
    plans = {}
    for own in ("false", "true"):
        result = keynes("plan", str(config), "--set", f"game.history.own_guesses={own}", "--format", "json")
        assert result.returncode == 0, result.stderr
        (plans[own],) = json.loads(result.stdout)
    assert plans["false"]["distinct_prompts"] == 10 and plans["false"]["basis"].endswith("; 10 distinct prompts"), plans
    # with own guesses: about as many as Gemma's round-1 answers make likely, never more than 5 + 5 × 101
    assert plans["false"]["distinct_prompts_at_most"] is None and plans["true"]["distinct_prompts_at_most"] == 5 + 5 * 101, plans
    assert 10 < plans["true"]["distinct_prompts"] <= 510, plans
    assert plans["true"]["basis"].endswith(f"; about {plans['true']['distinct_prompts']:,} distinct prompts (at most 510)"), plans
    assert 0 < plans["false"]["seconds"] < plans["true"]["seconds"] < 600, plans  # 200,000 decisions in minutes at most
    assert not (tmp_path / "never.duckdb").exists()


def test_the_hosted_preset_plans_its_requests_per_agent_and_per_prompt(tmp_path):
    """experiments/hosted_openai.yaml at 10,000 agents of 5 personas (2,000 each) in one shard: round
    1's requests per prompt are ceil(2,000 / 128) = 16 a persona; round 2 shows each agent its own
    guess, at most 101 prompts a persona, so at most 101 + (2,000 − 101) / 128 = 115 requests; the
    answer after each reasoning is one request an agent."""
    from design.plan import batched_requests

    sets_ = ["--set", "population.size=10000", "--set", "workers.shard_size=10000", "--set", f"db={tmp_path / 'never.duckdb'}"]
    result = keynes("plan", str(REPO / "experiments" / "hosted_openai.yaml"), *sets_, "--calibrate", "0", "--format", "json")
    assert result.returncode == 0, result.stderr
    basic, cot = json.loads(result.stdout)
    assert [(r["round"], r["phase"], r["way"], r["requests"], r["at_most"]) for r in basic["requests"]] == [
        (1, "answer", "per agent", 10000, False), (1, "answer", "per prompt", 5 * 16, False),
        (2, "answer", "per agent", 10000, False), (2, "answer", "per prompt", 5 * 115, True),
    ]
    assert [(r["round"], r["phase"], r["way"], r["requests"]) for r in cot["requests"]][:4] == [
        (1, "reasoning", "per agent", 10000), (1, "reasoning", "per prompt", 80), (1, "answer", "per agent", 10000), (1, "answer", "per prompt", 10000),
    ]
    for row in (basic, cot):  # the arm's tokens and cost are the per-prompt way's: a prompt billed once a request
        per_prompt = [r for r in row["requests"] if r["way"] == "per prompt"]
        per_agent = [r for r in row["requests"] if r["way"] == "per agent"]
        assert row["prompt_tokens"] == sum(r["prompt_tokens"] for r in per_prompt) < sum(r["prompt_tokens"] for r in per_agent)
        assert row["completion_tokens"] == sum(r["completion_tokens"] for r in per_agent)
        assert row["cost"] == pytest.approx(sum(r["cost"] for r in per_prompt), abs=1e-4) and row["cost"] > 0
    table = keynes("plan", str(REPO / "experiments" / "hosted_openai.yaml"), *sets_, "--calibrate", "0", env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "arm 1: requests per agent and per prompt" in table.stdout and "≤655" in table.stdout, table.stdout
    assert max(map(len, table.stdout.splitlines())) <= 80 and "…" not in table.stdout, table.stdout
    # The bound: a group's D distinct prompts take at most D + (k − D) / n requests.
    assert batched_requests(np.array([5, 3, 1]), 2, 0, 101) == (6, False)
    assert batched_requests(np.array([5, 3, 1]), 2, 1, 2) == (6, True)  # [2 + 3/2, 2 + 1/2, 1] floored
    assert batched_requests(np.array([300]), 128, 1, 101) == (102, True) and batched_requests(np.array([300]), 128, 2, 101) == (300, True)
