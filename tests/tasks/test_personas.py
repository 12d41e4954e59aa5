"""The personas stage: backstories through the engine layer on Ray, cached and reused,
shown to agents; the flow end to end with a population that has backgrounds."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from core.game import GameRule
from populations.backstories import BackstoryConfig, clean_backstory
from populations.sampler import sample
from populations.spec import load_spec
from prompts.context import agent_variables, game_context
from prompts.render import render
from tasks.personas import BackstoryCounts, attach_backstories, backstory_requests
from tests.conftest import REPO
from tests.support.sql import q
from warehouse.backstories import count_backstories
from warehouse.store import Warehouse

BACKGROUND_TEMPLATE = REPO / "tests/tasks/background.j2"
OPENING_TEMPLATE = REPO / "tests/tasks/occupation_backstory.j2"
SIMULATED = BackstoryConfig(enabled=True, engine={"kind": "simulated"}, batch_size=4)



@pytest.fixture(scope="module")
def first_run(tmp_path_factory, local_ray):
    """Ten adults get backstories from the simulated engine, on two Ray actors."""
    path = tmp_path_factory.mktemp("backstories") / "keynes.duckdb"
    warehouse = Warehouse(path)
    personas = sample(load_spec("adults.yaml"), 10, seed=3)
    with_backstories, counts = attach_backstories(personas, SIMULATED, 3, warehouse, actors=2)
    return warehouse, personas, with_backstories, counts


def test_backstories_are_generated_once_per_persona_and_stored(first_run):
    warehouse, personas, frame, counts = first_run
    assert counts == BackstoryCounts(generated=10, reused=0, failed=0)
    assert count_backstories(warehouse) == 10
    assert frame.drop("background").equals(personas)
    # each background opens with the persona's own name and continues with the engine's text
    for name, background in frame.select("name", "background").iter_rows():
        assert background.startswith(f"My name is {name}. (simulated text #")
    assert frame["background"].n_unique() == 10
    stored = q(warehouse.path, "select distinct engine, model, template_hash, max_tokens from backstories")
    assert stored == [("simulated", "simulated/uniform", stored[0][2], 96)]


def test_a_second_run_reuses_every_backstory_and_generates_none(first_run):
    warehouse, personas, frame, _ = first_run
    again, counts = attach_backstories(personas, SIMULATED, 3, warehouse, actors=2)
    assert counts == BackstoryCounts(generated=0, reused=10, failed=0)
    assert count_backstories(warehouse) == 10
    assert again["background"].equals(frame["background"])


def test_a_changed_meta_prompt_writes_new_backstories(first_run, tmp_path):
    shared, personas, frame, _ = first_run
    # A copy of the module's warehouse: the other tests count its backstories, in any order.
    warehouse = Warehouse(shutil.copy(shared.path, tmp_path / "copy.duckdb"))
    template = tmp_path / "terse.j2"
    template.write_text("Profile: {{ persona.education }}, {{ persona.age }}.\nI am")
    terse = SIMULATED.model_copy(update={"template": str(template)})
    before = count_backstories(warehouse)
    out, counts = attach_backstories(personas, terse, 3, warehouse, actors=1)
    assert counts.generated == 10 and count_backstories(warehouse) == before + 10
    assert out["background"].str.starts_with("I am (simulated text #").all()


def test_cache_keys_follow_attributes_seed_and_model(first_run):
    _, personas, _, _ = first_run
    keys = backstory_requests(personas, SIMULATED, 3, "simulated/uniform")["key"]
    assert keys.n_unique() == 10
    assert backstory_requests(personas, SIMULATED, 3, "simulated/uniform")["key"].equals(keys)
    assert not backstory_requests(personas, SIMULATED, 4, "simulated/uniform")["key"].is_in(keys.implode()).any()
    assert not backstory_requests(personas, SIMULATED, 3, "gemma-3-270m")["key"].is_in(keys.implode()).any()


def test_the_rendered_prompt_shows_the_backstory(first_run):
    _, _, frame, _ = first_run
    shared = {"game": game_context(GameRule(), 10), "round": 1, "history": []}
    prompts = render(str(BACKGROUND_TEMPLATE), shared, agent_variables(frame))
    for prompt, background in zip(prompts, frame["background"]):
        assert f"About you: {background}\n" in prompt


def test_clean_backstory_keeps_the_opening_and_whole_sentences():
    prompt = "Profile: ...\nMy name is Ann Lee."
    assert clean_backstory(prompt, " I grew up in Ohio.  I teach\nmath. When I") == "My name is Ann Lee. I grew up in Ohio. I teach math."
    assert clean_backstory(prompt, " I farm.\n\nParticipant profile: ...") == "My name is Ann Lee. I farm."
    assert clean_backstory("x\nI am", "") == "I am"


def test_personas_schema_rejects_missing_demographics(tmp_path):
    import pandera.errors

    frame = sample(load_spec("education.yaml"), 5, seed=0).with_columns(
        education=pl.when(pl.col("agent_id") == 2).then(None).otherwise(pl.col("education"))
    )
    with pytest.raises(pandera.errors.SchemaErrors, match="every demographic column is filled"):
        Warehouse(tmp_path / "k.duckdb").write_personas("x", frame)
    assert not (tmp_path / "k.duckdb").exists()  # validated before the file is opened


# ----------------------------------------------------------------------------- the flow
CONFIG = {
    "name": "backgrounds",
    "seed": 3,
    "population": {
        "spec": "adults.yaml",
        "size": 12,
        "backstories": {"enabled": True, "engine": {"kind": "simulated"}, "batch_size": 5, "template": str(OPENING_TEMPLATE)},
    },
    "game": {"rounds": 1},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": [str(BACKGROUND_TEMPLATE)]},
    "workers": {"actors": 2, "shard_size": 6},
    "report": {"enabled": False},
}


@pytest.fixture(scope="module")
def flow_db(tmp_path_factory, prefect_api, local_ray):
    from flows.experiment import experiment

    path = tmp_path_factory.mktemp("flow") / "keynes.duckdb"
    experiment(CONFIG, db=str(path))
    return path


def test_the_experiment_stores_personas_with_backgrounds_and_demographics(flow_db):
    assert q(flow_db, "select count(*), count(background), count(distinct background) from personas") == [(12, 12, 12)]
    assert q(flow_db, "select count(*) from backstories") == [(12,)]
    # demographic columns are plain SQL columns
    rows = q(flow_db, "select education, count(*) from personas group by all order by all")
    assert sum(n for _, n in rows) == 12 and len(rows) >= 4
    assert q(flow_db, "select min(age) >= 18, max(age) < 90 from personas") == [(True, True)]


def test_agents_prompts_contain_their_backstory(flow_db):
    # The simulated engine counts a prompt's words: the prompt is the shared text plus the
    # persona's background (whose length varies with the occupation), so
    # (prompt words - background words) is the same for everyone.
    rows = q(
        flow_db,
        """select count(distinct g.prompt_tokens - len(string_split(p.background, ' '))), count(distinct g.prompt_tokens)
           from guesses g join personas p using (agent_id) join runs r on r.run_id = g.run_id
           where p.experiment_id = r.experiment_id""",
    )
    assert rows[0][0] == 1 and rows[0][1] > 1


def test_another_experiment_over_the_same_population_reuses_the_backstories(flow_db, prefect_api, local_ray, tmp_path):
    from flows.experiment import experiment

    # A copy of the module's warehouse: the other tests count its rows, in any order.
    flow_db = shutil.copy(flow_db, tmp_path / "copy.duckdb")
    other = {**CONFIG, "name": "backgrounds-again"}
    experiment(other, db=str(flow_db))
    assert q(flow_db, "select count(distinct experiment_id), count(*) from personas") == [(2, 24)]
    assert q(flow_db, "select count(*) from backstories") == [(12,)]  # nothing generated
    assert q(
        flow_db,
        """select count(*) from personas a join personas b using (agent_id)
           where a.experiment_id < b.experiment_id and a.background = b.background""",
    ) == [(12,)]


# ----------------------------------------------------------------------------- the CLI
def test_cli_backstories_are_generated_then_reused(tmp_path):
    import os
    import subprocess
    import sys

    db = tmp_path / "k.duckdb"
    args = [sys.executable, "-m", "cli.app", "personas", "adults.yaml", "--n", "6", "--seed", "2", "--db", str(db),
            "--backstories", "--engine", "simulated"]
    env = {**os.environ, "COLUMNS": "200"}
    first = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    assert "backstories: 6 generated, 0 reused, 0 failed" in first.stderr
    second = subprocess.run(args, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert second.returncode == 0, second.stderr
    assert "backstories: 0 generated, 6 reused, 0 failed" in second.stderr and "already stored" in second.stderr
    assert q(db, "select count(*), count(background) from personas") == [(6, 6)]
    assert q(db, "select count(*) from backstories") == [(6,)]


def test_cli_unknown_backstory_engine_exits_2(tmp_path):
    import subprocess
    import sys

    db = tmp_path / "k.duckdb"
    result = subprocess.run(
        [sys.executable, "-m", "cli.app", "personas", "education.yaml", "--n", "5", "--db", str(db), "--backstories", "--engine", "warp"],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--engine: unknown engine 'warp'; available:" in lines[0], result.stderr
    assert not db.exists()


# ----------------------------------------------------------------------------- real Gemma
@pytest.mark.llm
def test_gemma_writes_backstories_that_are_stored_reused_and_shown(tmp_path, local_ray):
    warehouse = Warehouse(tmp_path / "keynes.duckdb")
    personas = sample(load_spec("adults.yaml"), 6, seed=5)
    settings = BackstoryConfig(enabled=True, max_tokens=48, batch_size=3)  # the default engine
    assert settings.engine_spec().kind == "llamacpp" and settings.engine_spec().model_name == "gemma-3-270m"

    frame, counts = attach_backstories(personas, settings, 5, warehouse, actors=1)
    assert counts == BackstoryCounts(generated=6, reused=0, failed=0)
    assert q(warehouse.path, "select distinct engine, model from backstories") == [("llamacpp", "gemma-3-270m")]
    rows = q(warehouse.path, "select raw, background, completion_tokens from backstories")
    assert len(rows) == 6
    for name, background in frame.select("name", "background").iter_rows():
        assert background.startswith(f"My name is {name}.")
    # the model wrote something of its own (a base model may stop at once now and then)
    assert sum(tokens > 0 and len(background.split()) > 5 for _, background, tokens in rows) >= 3

    again, counts = attach_backstories(personas, settings, 5, warehouse, actors=1)
    assert counts == BackstoryCounts(generated=0, reused=6, failed=0)
    assert again["background"].equals(frame["background"])
    assert q(warehouse.path, "select count(*) from backstories") == [(6,)]

    shared = {"game": game_context(GameRule(), 6), "round": 1, "history": []}
    prompts = render(str(BACKGROUND_TEMPLATE), shared, agent_variables(frame))
    for prompt, background in zip(prompts, frame["background"]):
        assert f"About you: {background}\n" in prompt
