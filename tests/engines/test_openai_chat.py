"""The openai engine's chat format against the real llama.cpp server serving SmolLM2 135M Instruct.

The server applies the chat template of the GGUF it serves; the prompt it evaluated is
checked, token for token, against llama-cpp-python's formatting of that template.
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from design.arms import Arm
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from prompts.answers import number_regex
from prompts.chat import split_cues
from prompts.context import game_context
from prompts.render import render
from tasks.actor import ShardJob, ShardPlayer
from tests.engines.conftest import LlamaServer, served

pytestmark = pytest.mark.llm

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree"]


@pytest.fixture(scope="module")
def smol_path():
    from engines.models import gguf_path

    return gguf_path("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def smol_server(smol_path, tmp_path_factory):
    with served(smol_path, tmp_path_factory.mktemp("smol-server") / "server") as server:
        yield server


def spec(server: LlamaServer) -> dict:
    return {"kind": "openai", "base_url": server.base_url, "model": "smollm2", "prompt_format": "chat", "concurrency": 2}


def rendered(template: str) -> list[str]:
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    return render(template, shared, pl.DataFrame({"persona": [{"education": e} for e in EDUCATION]}))


def test_chat_answers_are_numbers_in_the_servers_template(smol_server, smol_path):
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    users, cues = split_cues(rendered("basic.j2"))
    ids = np.arange(len(users), dtype=np.int64)
    engine = build_engine(parse_spec(spec(smol_server)))
    try:
        assert engine.prompt_format == "chat"
        out = engine.generate(RequestBatch(ids, users, ids * 31 + 5, Sampling(0.7, 8), Constraint(0, 100), opening=cues))
    finally:
        engine.close()
    assert all(re.fullmatch(number_regex(0, 100), t) for t in out.text), out.text
    assert out.error == [None] * len(users)
    assert "POST /v1/chat/completions HTTP/1.1\" 200" in smol_server.logs()
    # What the server evaluated: the user message and the assistant's opening, in SmolLM2's template.
    vocab = Llama(model_path=str(smol_path), vocab_only=True, verbose=False)
    try:
        fmt = Jinja2ChatFormatter(
            template=vocab.metadata["tokenizer.chat_template"],
            eos_token=vocab._model.token_get_text(vocab.token_eos()),
            bos_token=vocab._model.token_get_text(vocab.token_bos()),
        )
        for user, cue, tokens in zip(users, cues, out.prompt_tokens):
            text = fmt(messages=[{"role": "user", "content": user}, {"role": "assistant", "content": cue}]).prompt
            assert "<|im_start|>user\n" + user in text
            assert tokens == len(vocab.tokenize(text.encode(), add_bos=False, special=True))
    finally:
        vocab.close()


def test_chain_of_thought_through_the_chat_endpoint(smol_server):
    rule = GameRule()
    arm = Arm(0, "run-cot", parse_spec(spec(smol_server)), "cot", 0.7, rule, max_reasoning_tokens=32)
    agents = pl.DataFrame({"agent_id": np.arange(4, dtype=np.int64), "education": EDUCATION})
    job = ShardJob(arm, seed=3, round=1, shard=0, agents=agents, shared={"game": game_context(rule, 30), "round": 1, "history": []})
    player = ShardPlayer(arm.engine)
    try:
        guesses = player.play(job).guesses
    finally:
        player.close()
    assert guesses["valid"].all(), guesses.select("raw", "error").rows()
    assert sum(bool(r.strip()) for r in guesses["reasoning"]) >= 3
    assert (guesses["model"] == "smollm2").all() and (guesses["engine"] == "openai").all()
