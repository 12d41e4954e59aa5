"""The llamacpp engine on the real Gemma 3 270M: constrained answers, seeds, reasoning, a game."""

from __future__ import annotations

import json
import re

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from engines.models import ModelError
from prompts.answers import number_regex
from prompts.context import game_context
from prompts.render import render
from tests.conftest import QUICKSTART_AGENTS, QUICKSTART_ROUNDS
from tests.support.sql import q

pytestmark = pytest.mark.llm

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]


@pytest.fixture(scope="module")
def engine(gguf):
    engine = build_engine(parse_spec({"kind": "llamacpp", "num_cpus": 1}))
    yield engine
    engine.close()


def prompts(template: str, n: int, rule: GameRule = GameRule()) -> list[str]:
    shared = {"game": game_context(rule, 30), "round": 1, "history": []}
    agents = pl.DataFrame({"persona": [{"education": EDUCATION[i % len(EDUCATION)]} for i in range(n)]})
    return render(template, shared, agents)


def batch(texts: list[str], constraint: Constraint | None, max_tokens: int = 8, seed0: int = 0) -> RequestBatch:
    ids = np.arange(len(texts), dtype=np.int64)
    return RequestBatch(ids, texts, ids * 7919 + seed0, Sampling(0.9, max_tokens), constraint)


@pytest.mark.parametrize(
    "rule",
    [GameRule(), GameRule(low=10, high=250), GameRule(low=0, high=1, answers="real")],
    ids=["0-100", "10-250", "real-0-1"],
)
def test_every_constrained_answer_is_a_number_in_range(engine, rule):
    constraint = Constraint(rule.low, rule.high, rule.integer)
    out = engine.generate(batch(prompts("basic.j2", 8, rule), constraint))
    pattern = re.compile(number_regex(rule.low, rule.high, rule.integer))
    assert all(pattern.fullmatch(t) for t in out.text), out.text
    assert out.error == [None] * 8
    assert (out.prompt_tokens > 40).all() and (out.completion_tokens >= 1).all()
    assert (out.latency_s > 0).all() and (out.attempts == 1).all()


def test_the_same_seeds_give_the_same_answers(engine, gguf):
    texts = prompts("basic.j2", 10)
    constraint = Constraint(0, 100, True)
    first = engine.generate(batch(texts, constraint)).text
    again = build_engine(parse_spec({"kind": "llamacpp"}))  # a fresh model: nothing cached
    try:
        assert again.generate(batch(texts, constraint)).text == first
    finally:
        again.close()
    others = engine.generate(batch(texts, constraint, seed0=12345)).text
    assert others != first  # 10 agents at temperature 0.9: other seeds, other numbers


def test_answers_come_back_in_request_order(engine):
    # Requests run sorted by prompt (KV prefix reuse); results must follow the requests.
    texts = prompts("basic.j2", 5)
    constraint = Constraint(0, 100, True)
    forward = engine.generate(batch(texts, constraint))
    ids = np.arange(5, dtype=np.int64)[::-1].copy()
    backward = engine.generate(RequestBatch(ids, texts[::-1], ids * 7919, Sampling(0.9, 8), constraint))
    assert backward.text == forward.text[::-1]


def test_free_reasoning_is_text_that_stops_at_a_blank_line(engine):
    out = engine.generate(batch(prompts("cot.j2", 4), None, max_tokens=48))
    assert sum(bool(t.strip()) for t in out.text) >= 3, out.text
    assert not any("\n\n" in t for t in out.text)
    assert (out.completion_tokens <= 48).all() and (out.completion_tokens >= 1).all()


def test_a_prompt_beyond_the_context_fails_alone(gguf):
    small = build_engine(parse_spec({"kind": "llamacpp", "n_ctx": 256}))
    try:
        texts = prompts("basic.j2", 2)
        texts[1] = texts[1] + " word" * 400
        out = small.generate(batch(texts, Constraint(0, 100, True)))
    finally:
        small.close()
    assert out.error[0] is None and re.fullmatch(number_regex(0, 100), out.text[0])
    assert out.text[1] == "" and "exceed context window" in out.error[1]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8"), max_size=60) | st.text("0123456789 .,:;\n\t<>_bosBOS", max_size=60))
def test_a_completion_prompt_has_at_most_a_token_per_byte_beyond_three(gguf, text):
    # The context check skips the tokenizer of a bundled completion-format model when the prompts'
    # bytes plus 3 fit (LlamaCppSpec.check_context); the bound must hold for any text, special
    # tokens written out and byte-fallback characters included.
    from engines.llamacpp.engine import _UNTEXTUAL_TOKENS

    texts = [text, "<bos>" + text, text + "<start_of_turn>user"]
    counted = parse_spec({"kind": "llamacpp"}).count_tokens(texts)
    assert (counted <= np.array([len(t.encode()) for t in texts]) + _UNTEXTUAL_TOKENS).all()


def test_the_context_check_counts_exactly_when_the_bytes_do_not_settle_it(gguf, monkeypatch):
    spec = parse_spec({"kind": "llamacpp", "n_ctx": 64})
    with monkeypatch.context() as patched:  # bytes that settle it: no tokenizer
        patched.setattr(type(spec), "count_tokens", lambda self, prompts: pytest.fail("counted"))
        spec.check_context(["é" * 28], reserve=4, mode="basic")  # 56 bytes + 3 + 4 = 63
    fits = "seven " * 10  # 60 bytes: the bound (63 + 4) says no, the count (~11 + BOS) says yes
    spec.check_context([fits], reserve=4, mode="basic")
    with pytest.raises(ValueError, match=r"^n_ctx: 64 tokens cannot hold the longest prompt of mode 'basic' \((\d+) tokens"):
        spec.check_context(["word " * 70], reserve=4, mode="basic")


def test_llama_cpp_is_built_without_amx_kernels():
    # A -march=native build on an AMX CPU routes Q4_K products through ggml's AMX kernels, which
    # crash in llama_decode (pyproject.toml builds with GGML_NATIVE=OFF); the portable build has
    # AVX2 and ggml's CPU repacking, and no AMX.
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    assert "AVX2 = 1" in info and "REPACK = 1" in info, info
    assert "AMX" not in info, info


def test_an_unknown_model_is_named():
    # Refused when the config is read, before any engine is built.
    with pytest.raises(ValueError, match="unknown model 'gemma-7b'; available: gemma-3-270m, smollm2-135m-instruct, or a path"):
        parse_spec({"kind": "llamacpp", "model": "gemma-7b"})
    with pytest.raises(ModelError, match="model file '/nowhere/gemma-7b.gguf' does not exist"):
        build_engine(parse_spec({"kind": "llamacpp", "model": "/nowhere/gemma-7b.gguf"}))


def test_real_gemma_agents_play_the_quickstart_basic_and_chain_of_thought(quickstart):
    """The session's quickstart run (10 agents × 2 rounds × basic and cot, 2 actors, shards of 5)."""
    guesses = QUICKSTART_AGENTS * QUICKSTART_ROUNDS  # per arm
    db, summary = quickstart
    assert summary.rows_written == guesses * 2
    assert q(db, "select count(*) from guesses where not valid") == [(0,)]
    assert q(db, "select count(*) from guesses where guess < 0 or guess > 100 or guess != round(guess)") == [(0,)]
    assert q(db, "select distinct engine, model from guesses") == [("llamacpp", "gemma-3-270m")]
    assert q(db, "select min(prompt_tokens) > 40, min(completion_tokens) >= 1, min(latency_s) > 0, min(attempts) from guesses") == [(True, True, True, 1)]
    rows = q(db, "select r.prompt_mode, count(*), count(g.reasoning), count(nullif(trim(g.reasoning), '')) from guesses g join runs r using (run_id) group by all order by 1")
    assert rows[0] == ("basic", guesses, 0, 0)
    assert rows[1][:3] == ("cot", guesses, guesses) and rows[1][3] >= 0.7 * guesses  # a base model may open with a blank line
    # Chain of thought spends more tokens: the reasoning's are counted too.
    tokens = dict(q(db, "select r.prompt_mode, avg(g.completion_tokens) from guesses g join runs r using (run_id) group by all"))
    assert tokens["cot"] > tokens["basic"]
    # Every round of both arms is stored.
    assert q(db, "select count(distinct (run_id, round)) from guesses") == [(2 * QUICKSTART_ROUNDS,)]


def test_a_mixture_of_gemma_and_the_simulated_engine(prefect_api, local_ray, db):
    from flows.experiment import experiment

    mixture = {"kind": "mixture", "components": [
        {"fraction": 0.5, "engine": {"kind": "llamacpp"}},
        {"fraction": 0.5, "engine": {"kind": "simulated"}},
    ]}
    config = {
        "name": "gemma-mixture", "seed": 5,
        "population": {"spec": "education.yaml", "size": 8},
        "game": {"rounds": 2},
        "arms": {"engines": [mixture], "prompts": ["basic"]},
        "workers": {"actors": 2, "shard_size": 3},
        "report": {"enabled": False},
    }
    experiment(config, db=str(db))
    assert q(db, "select engine, model, count(*), count(distinct agent_id), bool_and(valid) from guesses group by all order by 1") == [
        ("llamacpp", "gemma-3-270m", 8, 4, True),
        ("simulated", "simulated/uniform", 8, 4, True),
    ]
    # Each agent keeps its engine in every round.
    assert q(db, "select count(*) from (select agent_id from guesses group by agent_id having count(distinct engine) > 1)") == [(0,)]
    engine, model, spec = q(db, "select engine, model, spec from runs")[0]
    assert (engine, model) == ("mixture", "mixture")
    assert [c["engine"]["kind"] for c in json.loads(spec)["components"]] == ["llamacpp", "simulated"]


def test_shared_answers_count_the_tokens_they_evaluate_against_the_trie_bound(gguf):
    """The work counters of the shared path (stored per shard): a prompt never seen costs at
    least all its tokens; a later prompt costs at least its edges past the prefix it shares
    with the previous one; every answer-tree node after the root costs at least one token."""
    from engines.llamacpp.blocks import common_prefix

    engine = build_engine(parse_spec({"kind": "llamacpp", "num_cpus": 1}))
    try:
        assert (engine.tokens_evaluated, engine.tokens_bound) == (0, 0)
        constraint = Constraint(0, 100, True)
        first, second = prompts("basic.j2", 2)  # two personas: one shared prefix, then they differ
        engine.generate(batch([first] * 3, constraint))  # one distinct prompt, three agents
        shared = engine._shared
        tokens = shared.prompt_tokens(first)
        nodes = engine.tokens_bound - len(tokens)  # answer-tree nodes after the root
        assert nodes >= 1 and engine.tokens_evaluated >= engine.tokens_bound
        evaluated, bound = engine.tokens_evaluated, engine.tokens_bound
        engine.generate(batch([second], constraint, seed0=1))
        edges = len(shared.prompt_tokens(second)) - common_prefix(tokens, shared.prompt_tokens(second))
        assert 0 < edges < len(tokens)
        assert engine.tokens_bound - bound > edges  # its edges, then its nodes
        assert engine.tokens_evaluated - evaluated >= engine.tokens_bound - bound
        counted = (engine.tokens_evaluated, engine.tokens_bound)
        engine.generate(batch([first, second], constraint, seed0=2))  # both computed before: kept, nothing evaluated
        assert (engine.tokens_evaluated, engine.tokens_bound) == counted
    finally:
        engine.close()
    per_agent = build_engine(parse_spec({"kind": "llamacpp", "num_cpus": 1, "shared_context": False}))
    try:
        assert (per_agent.tokens_evaluated, per_agent.tokens_bound) == (None, None)
    finally:
        per_agent.close()


def test_every_shard_of_the_quickstart_says_what_its_shared_answers_cost(quickstart):
    db, _ = quickstart
    rows = q(db, "select r.prompt_mode, count(*), count(s.tokens_evaluated), min(s.tokens_evaluated - s.tokens_bound), min(s.tokens_bound) "
                 "from shards s join runs r using (run_id) group by all order by 1")
    basic, cot = rows
    assert basic[1] == basic[2] and basic[3] >= 0 and basic[4] > 0  # counted on every shard of the basic arm
    assert cot[2] == 0  # chain of thought's answers are drawn in each agent's own stream: not counted
