"""The engine protocol: every engine declares its optional members (through ``EngineBase``),
and each spec owns what the plan and the budget check ask of it (tokens, time, price)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from engines import Engine, EngineBase, RequestBatch, Sampling, available, build_engine, parse_spec, spec_class

pytestmark = pytest.mark.quick

ENGINE_CLASSES = {"llamacpp": "engines.llamacpp:LlamaCppEngine", "openai": "engines.openai:OpenAIEngine",
                  "simulated": "engines.simulated:SimulatedEngine", "vllm": "engines.vllm:VllmEngine"}


def test_every_registered_engine_is_built_by_its_own_class_from_its_own_spec():
    """What ``EngineBase`` cannot give: each kind registers its own spec and engine class, the
    spec validates to that kind, and the class labels its rows with it and implements what the
    protocol leaves to each engine (``generate``, ``close``); the defaults it inherits are values
    the actors and the plan can use."""
    from engines import _REGISTRY

    assert sorted(ENGINE_CLASSES) == available()
    for kind, where in ENGINE_CLASSES.items():
        module, name = where.split(":")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, EngineBase) and cls.kind == kind, kind
        assert _REGISTRY[kind].build is cls and _REGISTRY[kind].spec is spec_class(kind), kind
        assert spec_class(kind).model_fields["kind"].default == kind, kind  # parse_spec({"kind": kind}) is this kind
        for member in ("generate", "close"):
            owner = next((c for c in cls.__mro__ if member in vars(c)), object)
            assert owner not in (EngineBase, object) and callable(vars(owner)[member]), (kind, member, owner)
        assert cls.prompt_format in ("completion", "chat") or isinstance(vars(cls).get("prompt_format"), property), kind
        assert isinstance(cls.limit_wait_s, (int, float)) or isinstance(vars(cls).get("limit_wait_s"), property), kind


def test_the_simulated_engine_is_an_engine_and_reasons_in_two_phases():
    engine = build_engine(parse_spec({"kind": "simulated"}))
    try:
        assert isinstance(engine, Engine)
        assert engine.prompt_format == "completion" and engine.limit_wait_s == 0.0
        ids = np.arange(3)
        free = RequestBatch(ids, ["a", "b", "c"], ids + 1, Sampling(0.7, 16), None)
        answer = RequestBatch(ids, ["a", "b", "c"], ids + 1, Sampling(0.7, 8), None)
        reasoning, answered = engine.reason_and_answer(free, answer, " So: ")
        assert len(reasoning) == len(answered) == 3
    finally:
        engine.close()


def test_specs_count_their_tokens_predict_their_time_and_price():
    simulated = parse_spec({"kind": "simulated", "latency_s": 0.5, "concurrency": 10})
    assert simulated.count_tokens(["one two three", "four"]).tolist() == [3, 1]
    assert simulated.context_window() is None
    # 100 agents on 2 actors of 10 requests at once: 5 waves per phase, 2 phases, 3 rounds.
    assert simulated.predicted_seconds(100, 3, 2, 2, None, None) == pytest.approx(3 * 2 * 5 * 0.5)

    server = {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
    openai = parse_spec(server | {"concurrency": 4, "prompt_price_per_million": 2.0, "requests_per_minute": 60})
    assert openai.count_tokens(["x"]) is None and openai.predicted_seconds(10, 1, 1, 1, None, None) is None
    assert openai.price(1e6, 5e5) == pytest.approx(2.0)
    assert parse_spec(server).price(1e6, 1e6) is None
    # 40 agents × 2 rounds at 1 s each over 4 requests in flight: 20 s, but 60 requests/minute hold it to 80 s.
    assert openai.predicted_seconds(40, 2, 1, 1, 1.0, 100.0) == pytest.approx(80.0)
    assert parse_spec(server | {"concurrency": 4}).predicted_seconds(40, 2, 1, 1, 1.0, 100.0) == pytest.approx(20.0)
    # ... from each request's latency, whatever the calibration shard's wall time was
    assert parse_spec(server | {"concurrency": 4}).predicted_seconds(40, 2, 1, 1, 1.0, 100.0, 0.1) == pytest.approx(20.0)
    # llama.cpp answers a shard's agents together: the shard's wall time over its agents, when known, not each one's latency
    llama = parse_spec({"kind": "llamacpp"})
    assert llama.predicted_seconds(30, 3, 2, 2, 4.7, None, 1.6) == pytest.approx(30 * 3 * 1.6 / 2)
    assert llama.predicted_seconds(30, 3, 2, 2, 4.7, None) == pytest.approx(30 * 3 * 4.7 / 2)
    # llama.cpp's shared path keeps prompts in blocks of 16 tokens (engines/llamacpp/blocks.py); the others token by token
    assert llama.prefix_block == 16 and parse_spec({"kind": "llamacpp", "shared_context": False}).prefix_block == 1
    assert simulated.prefix_block == openai.prefix_block == 1


def test_a_spec_that_knows_its_window_refuses_prompts_that_do_not_fit():
    class Words(spec_class("simulated")):  # a spec that counts words and has a 10-token window
        def context_window(self):
            return "n_ctx", 10

    spec = Words()
    spec.check_context(["a b c"], reserve=7, mode="basic")  # 3 + 7 fits
    with pytest.raises(ValueError, match=r"^n_ctx: 10 tokens cannot hold the longest prompt of mode 'basic' \(4 tokens, last round\) plus 7 .* at least 11$"):
        spec.check_context(["a b c", "a b c d"], reserve=7, mode="basic")
