"""Every config in experiments/ runs at a tiny size through the real flow.

Each config runs with ``--set``-style overrides: 5 agents, at most 2 rounds, one actor,
8 reasoning tokens. Engines are replaced so that the suite runs on a CPU laptop:

- an LLM engine (llamacpp, vllm, openai) becomes the default llamacpp engine — the real
  Gemma 3 270M — because what these configs test is LLM agents playing the game;
- in a ``mixture``, the first LLM component becomes llamacpp Gemma and the others become
  simulated behavioural rules (cognitive_hierarchy, uniform): the point there is several
  engines in one game, not three LLMs, and three Gemma actors would triple the cost;
- simulated engines (behavioural baselines) are kept as they are;
- engines that become the same CPU engine are kept once: the five vLLM models of
  ``models_prompts`` become one Gemma, since five identical arms would test nothing more;
- LLM-written backstories (``population.backstories``) are written by Gemma, 16 tokens each.
"""

from __future__ import annotations

import json

import pytest
import yaml

from flows.experiment import experiment
from flows.loading import load_config
from tests.conftest import REPO
from tests.support.sql import q

pytestmark = [pytest.mark.llm, pytest.mark.slow]

CONFIGS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "experiments").rglob("*.yaml"))
LLM_KINDS = {"llamacpp", "vllm", "openai"}
GEMMA = {"kind": "llamacpp"}  # the default model: Gemma 3 270M, from PyPI
#: Half a CPU each: a mixture's engines play at once, one actor each, and Gemma's takes one of the 2 CPUs.
STAND_INS = [{"kind": "simulated", "rule": "cognitive_hierarchy", "num_cpus": 0.5}, {"kind": "simulated", "rule": "uniform", "num_cpus": 0.5}]
SIZE, MAX_ROUNDS = 5, 2


def tiny(data: dict) -> list[str]:
    """The overrides that shrink a config to a few agents and CPU engines."""
    overrides = [
        f"population.size={SIZE}", "workers.actors=1", f"workers.shard_size={SIZE}", "workers.ray_address=null",
        "arms.max_reasoning_tokens=8", f"game.rounds={min(data.get('game', {}).get('rounds', 1), MAX_ROUNDS)}",
    ]
    arms = data.get("arms", {})
    for i, game in enumerate(arms.get("games", [])):
        if game.get("rounds", 1) > MAX_ROUNDS:
            overrides.append(f"arms.games.{i}.rounds={MAX_ROUNDS}")
    if "engines" in arms:
        engines = list({json.dumps(e, sort_keys=True): e for e in map(_cpu_engine, arms["engines"])}.values())
        overrides.append("arms.engines=" + json.dumps(engines))
    backstories = data.get("population", {}).get("backstories", {})
    if backstories.get("enabled"):  # LLM-written backstories: Gemma writes short ones
        overrides += ["population.backstories.engine=" + json.dumps(_cpu_engine(backstories.get("engine", GEMMA))),
                      "population.backstories.max_tokens=16"]
    return overrides


def _cpu_engine(engine: dict) -> dict:
    if engine.get("kind") == "mixture":
        components, stand_ins, gemma_used = [], iter(STAND_INS * 4), False
        for c in engine["components"]:
            inner = c["engine"]
            if inner.get("kind") in LLM_KINDS:
                inner = next(stand_ins) if gemma_used else GEMMA
                gemma_used = True
            components.append({**c, "engine": inner})
        return {**engine, "components": components}
    return GEMMA if engine.get("kind") in LLM_KINDS else engine



def test_configs_are_found():
    assert "experiments/quickstart.yaml" in CONFIGS
    assert len([c for c in CONFIGS if c.startswith("experiments/paper/")]) >= 10


@pytest.mark.parametrize("config", CONFIGS)
def test_config_runs_at_tiny_size(config, tmp_path, prefect_api, local_ray):
    source = REPO / config
    overrides = tiny(yaml.safe_load(source.read_text()))
    cfg = load_config(source, overrides)
    arms = cfg.arms_list()
    db = tmp_path / "tiny.duckdb"

    summary = experiment(str(source), overrides, db=str(db))

    rounds = sum(a.rule.rounds for a in arms)
    assert summary["rows_written"] == SIZE * rounds
    assert q(db, "select count(*), count(distinct (run_id, round, agent_id)) from guesses") == [(SIZE * rounds, SIZE * rounds)]
    assert q(db, "select count(*) from runs where status = 'completed'") == [(len(arms),)]
    assert q(db, "select count(*) from rounds") == [(rounds,)]
    # Every stored guess is in bounds or flagged, with the model's text kept.
    assert q(db, "select count(*) from guesses g join runs r using (run_id) where g.valid and (g.guess < r.low or g.guess > r.high)") == [(0,)]
    assert q(db, "select count(*) from guesses where not valid and error is null") == [(0,)]
    # Each run records its game and the equilibrium offset / (1 − ratio), clamped.
    for arm in arms:
        rule = arm.rule
        ratio = rule.fraction
        expected = rule.high if ratio >= 1 else min(max(rule.offset / float(1 - ratio), rule.low), rule.high)
        assert q(db, f"select ratio, \"offset\", equilibrium from runs where run_id = '{arm.run_id}'") == [(rule.ratio, rule.offset, pytest.approx(expected))]
    # Targets include the offset and come from the valid guesses.
    bad = q(db, """select count(*) from rounds o join runs r using (run_id)
                   join (select run_id, round, avg(guess) m from guesses where valid group by all) g using (run_id, round)
                   where abs(o.target - least(greatest(r.ratio_value * g.m + r."offset", r.low), r.high)) > 1e-9""")
    assert bad == [(0,)]
    # Engines are what the test put there: Gemma on llama.cpp or labelled simulated rules.
    kinds = {k for (k,) in q(db, "select distinct engine from guesses")}
    assert kinds <= {"llamacpp", "simulated"} and kinds
    if "simulated" in kinds:
        assert all(m.startswith("simulated/") for (m,) in q(db, "select distinct model from guesses where engine = 'simulated'"))
    if cfg.groups is not None:
        n_groups = q(db, "select count(distinct group_name) from group_members")[0][0]
        assert q(db, "select count(*) from group_rounds") == [(rounds * n_groups,)]
        # each group's target from its own members only
        assert q(db, """select count(*) from group_rounds o join runs r using (run_id)
                        join (select g.run_id, g.round, m.group_name, avg(g.guess) mean from guesses g
                              join group_members m using (agent_id) where g.valid group by all) x
                          using (run_id, round, group_name)
                        where abs(o.target - least(greatest(r.ratio_value * x.mean + r."offset", r.low), r.high)) > 1e-9""") == [(0,)]
