"""Batched free text and chain of thought on the real Gemma 3 270M (``engines.llamacpp.batch``):
an agent's text and answer depend on its own prompt and seed, never on who shares its batch."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from prompts.modes import FINAL_CUE
from tests.engines.test_llamacpp import prompts

pytestmark = pytest.mark.llm

CONSTRAINT = Constraint(0, 100, True)
N = 12


@pytest.fixture(scope="module")
def engine(gguf):
    # 4 slots: 12 agents are three slot-fulls, so slots are reused and idle at the end.
    engine = build_engine(parse_spec({"kind": "llamacpp", "num_cpus": 1, "sequences": 4}))
    yield engine
    engine.close()


def batches(idx: list[int], reasoning_tokens: int = 24) -> tuple[RequestBatch, RequestBatch]:
    texts = prompts("cot.j2", N)
    ids = np.asarray(idx, np.int64)
    seeds = ids * 7919 + 3
    chosen = [texts[i] for i in idx]
    return (RequestBatch(ids, chosen, seeds, Sampling(0.9, reasoning_tokens), None),
            RequestBatch(ids, chosen, seeds, Sampling(0.9, 8), CONSTRAINT))


@pytest.fixture(scope="module")
def whole(engine):
    free, answer = batches(list(range(N)))
    return engine.reason_and_answer(free, answer, FINAL_CUE)


def test_an_agents_text_and_answer_do_not_depend_on_its_batch(engine, whole):
    reasoning, answers = whole
    # the same agents, reversed, and a few of them alone with others' slots idle
    for idx in (list(range(N))[::-1], [7, 2, 11]):
        r, a = engine.reason_and_answer(*batches(idx), FINAL_CUE)
        assert list(r.text) == [reasoning.text[i] for i in idx]
        assert list(a.text) == [answers.text[i] for i in idx]
        got = a.distributions.sort("context", "answer")
        want = answers.distributions.filter(pl.col("context").is_in(a.context)).sort("context", "answer")
        assert got.equals(want)


def test_free_text_starts_and_ends_as_create_completion_does(engine):
    """Against ``create_completion`` on the same weights, with the batched context's prompt settings
    (flash attention, prompts in blocks of ``BLOCK`` tokens): its prompt logits are then bit for bit
    the batched path's, so with the same sampler chain and seed every agent's first token is the
    same. Later steps decode ``sequences`` rows at once, one row there; their logits differ in the
    last bits and a draw near a boundary flips (measured here: 1 of 12 texts of 48 tokens identical,
    the others agreeing for their first 2 to 14 tokens). Texts that agree must stop at the same token.
    Texts of 24 tokens here (1 of 12 identical).
    With llama.cpp's defaults (no flash attention, 512-token batches) prompt logits differ by up to
    0.9 and texts part from the first token on."""
    from llama_cpp import Llama

    from engines.llamacpp.blocks import BLOCK

    free = batches(list(range(N)), reasoning_tokens=24)[0]
    out = engine.generate(free)
    assert sum(bool(t.strip()) for t in out.text) >= len(out.text) - 1, out.text
    assert not any("\n\n" in t for t in out.text)  # the stop sequence ends a text and is cut off
    assert (out.completion_tokens <= 24).all() and (out.completion_tokens >= 1).all()
    ref = Llama(str(engine.path), n_ctx=2048, n_threads=1, n_threads_batch=1, n_batch=BLOCK, n_ubatch=BLOCK,
                flash_attn=True, seed=0, verbose=False)
    try:
        s = free.sampling

        def complete(prompt: str, seed: int, max_tokens: int) -> dict:
            ref.reset()  # every prompt evaluated whole, in blocks, as the batched path does
            return ref.create_completion(prompt, max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                                         min_p=s.min_p, repeat_penalty=s.repeat_penalty, seed=int(seed), stop=list(engine.spec.stop))

        rows, first = [], []
        for prompt, seed in zip(free.prompt, free.seed):
            done = complete(prompt, seed, s.max_tokens)
            n_prompt, n_completion = done["usage"]["prompt_tokens"], done["usage"]["completion_tokens"]
            rows.append((done["choices"][0]["text"], n_prompt, n_completion))
            if n_completion > 1:  # the first drawn token, read back from the tokens the completion evaluated
                first.append(ref.detokenize([int(ref.input_ids[n_prompt])]).decode("utf-8", "replace"))
            else:  # a one-token text is its first token (the stop sequence cut, if any, leaves it as it is)
                first.append(complete(prompt, seed, 1)["choices"][0]["text"])
    finally:
        ref.close()
    assert list(out.prompt_tokens) == [r[1] for r in rows]  # the same tokens, counted the same
    assert all(f and t.startswith(f) for f, t in zip(first, out.text)), (first, out.text)
    same = [i for i in range(len(rows)) if out.text[i] == rows[i][0]]
    print(f"whole texts identical to create_completion's: {len(same)} of {len(rows)}")
    assert all(out.completion_tokens[i] == rows[i][2] for i in same)
    # Texts of one token are their first token, drawn from bit-for-bit equal logits: every one of
    # them is create_completion's, counted the same (N identical texts, by construction).
    one = engine.generate(batches(list(range(N)), reasoning_tokens=1)[0])
    assert [(t, 1) for t in first] == list(zip(one.text, one.completion_tokens.tolist())), (first, one.text)


def test_each_answer_is_drawn_from_its_own_exact_distribution(engine, whole):
    reasoning, answers = whole
    assert all(e is None for e in answers.error) and answers.shared_prompt.all()
    dists = answers.distributions
    assert dists["context"].n_unique() == N and (dists["agents"] == 1).all()
    sums = dists.group_by("context").agg(pl.col("probability").sum())["probability"].to_numpy()
    assert np.allclose(sums, 1.0, atol=1e-6)
    for context, text in zip(answers.context, answers.text):
        p = dists.filter((pl.col("context") == context) & (pl.col("answer") == text))["probability"]
        assert len(p) == 1 and p[0] > 0, (context, text)
    # Each answer prompt (prompt + reasoning + cue) once more, on the single-stream shared path:
    # the same prompt and context key; the KV was computed another way (reasoning tokens one per
    # step here, in blocks there), so probabilities agree to float noise amplified, not bit for bit.
    answer = batches(list(range(N)))[1]
    follow = RequestBatch(answer.agent_id, [p + r + FINAL_CUE for p, r in zip(answer.prompt, reasoning.text)],
                          answer.seed, answer.sampling, CONSTRAINT)
    again = engine.generate(follow)
    assert list(again.context) == list(answers.context)
    both = dists.join(again.distributions, on=["context", "answer"], how="full", coalesce=True).fill_null(0.0)
    tv = both.group_by("context").agg(((pl.col("probability") - pl.col("probability_right")).abs().sum() / 2).alias("tv"))
    print(f"total variation, in-slot vs re-evaluated answer prompts: max {tv['tv'].max():.4f}, mean {tv['tv'].mean():.4f}")
    assert tv["tv"].max() < 0.2


def test_one_slot_without_room_for_the_prompt_fails_that_agent_only(gguf):
    small = build_engine(parse_spec({"kind": "llamacpp", "n_ctx": 256, "sequences": 2}))
    try:
        free, answer = batches([0, 1])
        long = [free.prompt[0], free.prompt[1] + " word" * 400]
        free = RequestBatch(free.agent_id, long, free.seed, free.sampling, None)
        answer = RequestBatch(answer.agent_id, long, answer.seed, answer.sampling, CONSTRAINT)
        r, a = small.reason_and_answer(free, answer, FINAL_CUE)
    finally:
        small.close()
    assert r.error[0] is None and a.error[0] is None and a.text[0].isdigit()
    assert "exceed context window" in r.error[1] and a.text[1] == ""
