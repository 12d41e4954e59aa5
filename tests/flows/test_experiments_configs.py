"""Every config in experiments/ runs at a tiny size through the real flow.

Each config runs through the ``experiment`` flow on the session's real Prefect API
(``prefect_api``) and real local Ray (``local_ray``), into a fresh DuckDB file, with
``--set``-style overrides: 5 agents (3 with the laptop profile), one actor, at most 2 rounds per
game, 8 reasoning tokens. What plays, per kind of config:

- ``quickstart.yaml`` plays on the engine it names, the real Gemma 3 270M on llama.cpp:
  the LLM is its point. Its run is the session's quickstart run (the ``quickstart``
  fixture: 10 agents, 2 rounds, with its report page), checked here like every other
  config's tiny run; this module shares that run's xdist group (tests/conftest.py).
- ``models.yaml`` plays on the engines it names: Gemma 3 270M and SmolLM2 135M Instruct on
  llama.cpp, alone and in their mixture; both models must be in the stored guesses. One
  round, of numbers from 0 to 10 (each prompt's answer tree 11 answers instead of 101): the
  quickstart plays round 2 and the whole 0–100 range, and tests/engines/test_prompt_formats.py
  plays the two models' mixture for two rounds.
- The paper's configs (``experiments/paper/``) play with the documented switch, ``--models
  laptop`` (experiments/profiles/laptop.yaml, docs/paper.md): their LLM engines, the backstory
  engine too, become the real Gemma 3 270M and SmolLM2 135M Instruct on llama.cpp (shared
  context), in order of first appearance, and arms that land on the same model merge. Numbers
  from 0 to 10 (``game.high=10``: each prompt's answer tree 11 answers), 3 agents, one round
  (two where later rounds are the point: ``PAPER_ROUNDS``), 8 reasoning tokens, 16-token
  backstories. Their runs against a served model (``--models
  served``, the session's vLLM server) are in tests/flows/test_paper_served.py.
- Every other config is checked for its wiring (arms, prompt modes, games, rounds,
  groups, mixtures, backstories, what is stored): each LLM engine it names becomes a
  stand-in, the ``simulated`` engine's ``cognitive_hierarchy`` rule with noise (a
  behavioural rule, not an LLM, labelled ``simulated/…`` in every row). Each distinct
  engine block gets its own τ, so every arm and mixture component keeps its own,
  recognisable engine, and the config keeps all its arms. The stand-in's answers go
  through the same answer parser as a model's (its valid path only) and it writes the
  reasoning phase's free text as labelled placeholders. Why: these configs name vLLM
  models on a GPU or a server; what they add over the quickstart is their shape, not another
  run of Gemma. Where their LLM engines run for real: ``vllm_cpu.yaml`` plays on real vLLM on
  CPU in tests/engines/test_vllm.py, ``served_vllm.yaml`` against vLLM's server in
  tests/engines/test_openai_vllm.py; ``vllm_gpu.yaml`` needs NVIDIA GPUs, which this machine
  and CI do not have (tests/gpu/ plays vLLM on a GPU where there is one);
  tests/flows/test_shipped_configs.py validates every engine block as shipped.
- Simulated engines that a config names itself (``paper/baselines.yaml``) play as shipped.
- LLM-written backstories (``population.backstories``, ``paper/education.yaml``) are
  written by the engine the profile puts there, stored with it and kept as the personas'
  backgrounds.

Each stand-in takes half a CPU, so a mixture's three actors fit the 2-CPU Ray. Prefect's
API and Ray are the session's, started once. Report pages are built for two configs only,
one per comparison the page draws besides prompt modes (see ``REPORTED``; the page shows
nothing of nested groups); the quickstart's page (prompt modes, several rounds) is built
and opened in Chromium by tests/reports/test_report.py. The other configs run with
``report.enabled=false``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import engines
from design.loading import load_config
from flows.experiment import experiment
from tests.conftest import EXPERIMENT_CONFIGS, QUICKSTART_OVERRIDES, REPO
from tests.support.sql import q

CONFIGS = EXPERIMENT_CONFIGS
LLM_KINDS = {"llamacpp", "vllm", "openai"}
#: Configs that play on the LLM engines they name (the LLM is their point).
REAL_LLM = {"experiments/quickstart.yaml", "experiments/models.yaml"}
#: The paper's configs: they play with the laptop profile (``--models laptop``).
PAPER = "experiments/paper/"
#: The laptop profile's engines (experiments/profiles/laptop.yaml), in the order the configs' engines map onto them.
LAPTOP = ({"kind": "llamacpp", "model": "gemma-3-270m"}, {"kind": "llamacpp", "model": "smollm2-135m-instruct"})
#: The config whose run is the session's quickstart run (see the module docstring).
SESSION_RUN = "experiments/quickstart.yaml"
#: Configs played as a short game: one round, of numbers from 0 to 10 (see the module docstring).
SHORT_GAME = {"experiments/models.yaml"}
#: The paper's configs whose point is what later rounds are told: played for two rounds (the
#: others, on the laptop profile's real models, for one).
PAPER_ROUNDS = {"experiments/paper/multi_round.yaml", "experiments/paper/five_rounds.yaml", "experiments/paper/nested_groups.yaml"}
#: Configs whose tiny run also builds its report page, and the comparison that page must draw.
REPORTED = {
    "experiments/models.yaml": "Mean guess per round by model",  # two real models, alone and mixed
    "experiments/paper/ratios.yaml": "Mean guess per round by game rule",  # two games
}
SIZE, LAPTOP_SIZE, MAX_ROUNDS, NOISE = 5, 3, 2, 2.0


def stand_in(index: int) -> dict:
    """The simulated stand-in for the ``index``-th distinct LLM engine of a config."""
    return {"kind": "simulated", "rule": "cognitive_hierarchy", "tau": 1.0 + 0.5 * index, "noise": NOISE, "num_cpus": 0.5}


def plan(config: str) -> tuple[list[str], list[dict], dict | None]:
    """The tiny run of a config: its overrides, the engines its arms play on (as the laptop
    profile maps them, as written into the overrides, or as shipped), and the engine that
    writes backstories (or None)."""
    data = yaml.safe_load((REPO / config).read_text())
    arms = data.get("arms", {})
    paper = config.startswith(PAPER)
    size = LAPTOP_SIZE if paper else SIZE
    overrides = ["models=laptop"] if paper else []
    overrides += [
        f"population.size={size}", "workers.actors=1", f"workers.shard_size={size}", "workers.ray_address=null",
        "arms.max_reasoning_tokens=8", f"game.rounds={1 if config in SHORT_GAME or paper and config not in PAPER_ROUNDS else min(data.get('game', {}).get('rounds', 1), MAX_ROUNDS)}",
        f"report.enabled={'true' if config in REPORTED else 'false'}",
    ]
    if config in SHORT_GAME or paper:
        overrides.append("game.high=10")
    for i, game in enumerate(arms.get("games", [])):
        if game.get("rounds", 1) > MAX_ROUNDS:
            overrides.append(f"arms.games.{i}.rounds={MAX_ROUNDS}")
    shipped = arms.get("engines", [{"kind": "simulated"}])
    backstories = data.get("population", {}).get("backstories", {})
    writer = backstories.get("engine", {"kind": "llamacpp"}) if backstories.get("enabled") else None
    if writer is not None and paper:
        overrides.append("population.backstories.max_tokens=16")
    if config in REAL_LLM:
        return overrides, shipped, writer
    stand_ins: dict[str, dict] = {}

    def replace(engine: dict) -> dict:
        if engine.get("kind") == "mixture":
            return {**engine, "components": [{**c, "engine": replace(c["engine"])} for c in engine["components"]]}
        if engine.get("kind") not in LLM_KINDS:
            return engine
        index = len(stand_ins)
        return stand_ins.setdefault(json.dumps(engine, sort_keys=True), LAPTOP[index % len(LAPTOP)] if paper else stand_in(index))

    played = list({json.dumps(e, sort_keys=True): e for e in map(replace, shipped)}.values())  # arms on one engine merge
    if played != shipped and not paper:
        overrides.append("arms.engines=" + json.dumps(played))
    if writer is not None:
        writer = replace(writer)
        if not paper:
            overrides.append("population.backstories.engine=" + json.dumps(writer))
    return overrides, played, writer


def leaves(engine: dict) -> set[tuple[str, str]]:
    """The (engine, model) labels an engine block's rows carry: a mixture's are its components'."""
    if engine.get("kind") == "mixture":
        return set().union(*(leaves(c["engine"]) for c in engine["components"]))
    spec = engines.parse_spec(engine)
    return {(spec.kind, spec.model_name)}


def test_configs_are_found():
    assert REAL_LLM | set(REPORTED) <= set(CONFIGS)
    assert len([c for c in CONFIGS if c.startswith(PAPER)]) >= 10
    assert not [c for c in CONFIGS if "/profiles/" in c]


def test_every_llm_engine_of_a_config_gets_its_own_stand_in_or_the_laptops_model_in_turn():
    _, played, _ = plan("experiments/vllm_gpu.yaml")
    assert played == [stand_in(0)]
    _, played, _ = plan("experiments/paper/mixture.yaml")
    assert [c["engine"]["model"] for c in played[0]["components"]] == ["gemma-3-270m", "smollm2-135m-instruct", "gemma-3-270m"]
    _, played, writer = plan("experiments/paper/education.yaml")
    assert writer == played[0] == LAPTOP[0]  # the same Qwen writes backstories and plays
    _, played, _ = plan("experiments/paper/models_prompts.yaml")
    assert played == list(LAPTOP)  # five models, two on a laptop
    _, played, _ = plan("experiments/paper/baselines.yaml")
    assert played == yaml.safe_load((REPO / "experiments/paper/baselines.yaml").read_text())["arms"]["engines"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "config", [pytest.param(c, marks=pytest.mark.llm) if c in REAL_LLM or c.startswith(PAPER) else c for c in CONFIGS]
)
def test_config_runs_at_tiny_size(config, tmp_path, prefect_api, local_ray, request):
    source = REPO / config
    overrides, played, writer = plan(config)
    if config == SESSION_RUN:  # played once for the session (the `quickstart` fixture), with its report
        db, summary = request.getfixturevalue("quickstart")
        overrides = QUICKSTART_OVERRIDES
    else:
        db = tmp_path / "tiny.duckdb"
        summary = experiment(str(source), overrides, db=str(db))
    cfg = load_config(source, overrides)
    arms = cfg.arms_list()
    size = cfg.population.size  # SIZE, or the session run's

    # The stand-ins keep the config's arms: every engine × prompt × temperature × game (the
    # laptop profile's arms on one model merge).
    shipped = load_config(source).arms
    assert len(arms) == len(played) * len(shipped.prompts) * len(shipped.games) * len(shipped.temperatures)
    rounds = sum(a.rule.rounds for a in arms)
    assert summary.rows_written == size * rounds
    assert q(db, "select count(*), count(distinct (run_id, round, agent_id)) from guesses") == [(size * rounds, size * rounds)]
    assert q(db, "select count(*) from runs where status = 'completed'") == [(len(arms),)]
    assert q(db, "select count(*) from rounds") == [(rounds,)]
    # Every stored guess is in bounds or flagged, with the engine's text kept.
    assert q(db, "select count(*) from guesses g join runs r using (run_id) where g.valid and (g.guess < r.low or g.guess > r.high)") == [(0,)]
    assert q(db, "select count(*) from guesses where not valid and error is null") == [(0,)]
    # Each run records its game and the equilibrium offset / (1 − ratio), clamped.
    for arm in arms:
        rule = arm.rule
        ratio = rule.fraction
        expected = rule.high if ratio >= 1 else min(max(rule.offset / float(1 - ratio), rule.low), rule.high)
        assert q(db, f"select ratio, \"offset\", equilibrium from runs where run_id = '{arm.run_id}'") == [(rule.ratio, rule.offset, pytest.approx(expected))]
        # Modes that reason store a reasoning for every guess; the others none.
        assert q(db, f"select count(*) filter (where reasoning is not null) from guesses where run_id = '{arm.run_id}'") == [
            (size * rule.rounds if arm.mode.reasoning else 0,)
        ]
    # Targets include the offset and come from the valid guesses.
    bad = q(db, """select count(*) from rounds o join runs r using (run_id)
                   join (select run_id, round, avg(guess) m from guesses where valid group by all) g using (run_id, round)
                   where abs(o.target - least(greatest(r.ratio_value * g.m + r."offset", r.low), r.high)) > 1e-9""")
    assert bad == [(0,)]
    # The rows carry exactly the engines and models this test put there (or the shipped
    # ones), each run its own engine's: a stand-in that did not apply fails here.
    assert set(q(db, "select distinct engine, model from guesses")) == set().union(*map(leaves, played))
    per_run = {}
    for run_id, engine, model in q(db, "select distinct run_id, engine, model from guesses"):
        per_run.setdefault(run_id, set()).add((engine, model))
    assert per_run == {a.run_id: leaves(a.engine.model_dump(mode="json")) for a in arms}
    if config == "experiments/models.yaml":
        (mixture,) = [a.run_id for a in arms if a.engine.kind == "mixture" and a.prompt_mode == "basic"]
        assert per_run[mixture] == {("llamacpp", "gemma-3-270m"), ("llamacpp", "smollm2-135m-instruct")}
    if writer is not None:
        (label,) = leaves(writer)
        assert q(db, "select engine, model, count(*) from backstories group by all") == [(*label, size)]
        assert q(db, "select count(*) from personas p join backstories b on p.background = b.background where length(p.background) > 0") == [(size,)]
    if config.startswith(PAPER):
        assert cfg.models == "laptop" and json.loads(q(db, "select config from experiments")[0][0])["models"] == "laptop"
    if cfg.groups is not None:
        n_groups = q(db, "select count(distinct group_name) from group_members")[0][0]
        assert n_groups > 1
        assert q(db, "select count(*) from group_rounds") == [(rounds * n_groups,)]
        # each group's target from its own members only
        assert q(db, """select count(*) from group_rounds o join runs r using (run_id)
                        join (select g.run_id, g.round, m.group_name, avg(g.guess) mean from guesses g
                              join group_members m using (agent_id) where g.valid group by all) x
                          using (run_id, round, group_name)
                        where abs(o.target - least(greatest(r.ratio_value * x.mean + r."offset", r.low), r.high)) > 1e-9""") == [(0,)]
    if config in REPORTED or config == SESSION_RUN:
        assert summary.report == str(db.with_name(f"{cfg.name}-report.html"))
        assert REPORTED.get(config, cfg.name) in Path(summary.report).read_text(encoding="utf-8")
    else:
        assert summary.report is None
