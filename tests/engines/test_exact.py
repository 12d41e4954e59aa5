"""Shared-context answers on the real SmolLM2 135M Instruct, in its chat format: exact
distributions, checked three ways.

(1) each distribution sums to 1; (2) each answer's probability equals an independent
computation (every token path spelling it, evaluated directly, masked and renormalised step by
step); (3) draws from the shared path and from the per-agent path (llama.cpp's own sampler and
grammar, drawn afresh on every run) are the same distribution by a chi-square test, whose power
is computed from the exact distributions and asserted, and which rejects a changed temperature.

SmolLM2 stands in for Gemma here because the per-agent path's cost is the point of (3): its
vocabulary is 49k tokens against Gemma's 262k, and a per-agent draw costs about a quarter of
Gemma's (measured side by side: 150 against 585 ms of CPU per draw on a loaded machine).
"""

from __future__ import annotations

import math
import re
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np
import polars as pl
import pytest
from scipy.optimize import brentq
from scipy.stats import chi2, ncx2

from core.game import GameRule
from core.seeds import agent_seeds
from engines import Constraint, RequestBatch, Sampling, build_engine, parse_spec
from engines.llamacpp.shared_context import LlamaCppSharedContext, answer_vocab
from engines.shared_context import Chain, answer_language
from prompts.answers import number_regex
from prompts.chat import split_cues
from prompts.context import game_context
from prompts.render import render

pytestmark = pytest.mark.llm

MODEL = "smollm2-135m-instruct"
EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
#: A short prompt: the per-agent path re-evaluates one token of it per agent (KV prefix). Its
#: last line opens the assistant's turn, as every game prompt's cue does (``split_cues``).
SHORT = "Pick a number from 0 to 100.\nMy number is:"
CONSTRAINT = Constraint(0, 100, True)
#: The chi-square test's game: a narrower range, so each per-agent draw (the test's cost) is at
#: most two tokens, and as much power against T 1.0 as 0–100 has at the same draws.
TINY = "Pick a number from 0 to 10.\nMy number is:"
TINY_CONSTRAINT = Constraint(0, 10, True)
ALPHA = 0.001


@pytest.fixture(scope="module")
def engine():
    engine = build_engine(parse_spec({"kind": "llamacpp", "model": MODEL, "num_cpus": 1}))
    assert engine.prompt_format == "chat"
    yield engine
    engine.close()


def quickstart_prompts() -> list[str]:
    shared = {"game": game_context(GameRule(), 30), "round": 1, "history": []}
    return render("basic.j2", shared, pl.DataFrame({"persona": [{"education": e} for e in EDUCATION]}))


def seeds(n: int, label: str) -> np.ndarray:
    return (agent_seeds(7, np.arange(n), label) & np.uint64(0xFFFFFFFF)).astype(np.int64)


def chat_batch(prompts: list[str], seed: np.ndarray, sampling: Sampling, constraint: Constraint = CONSTRAINT) -> RequestBatch:
    """Game prompts as the actor sends them to a chat model: the cue line opens the assistant's turn."""
    users, openings = split_cues(prompts)
    return RequestBatch(np.arange(len(prompts)), users, seed, sampling, constraint, opening=openings)


def shared_distribution(engine, prompt: str, sampling: Sampling, constraint: Constraint = CONSTRAINT) -> dict[str, float]:
    frame = engine.generate(chat_batch([prompt], seeds(1, "d"), sampling, constraint)).distributions
    return dict(zip(frame["answer"], frame["probability"]))


@pytest.mark.parametrize(
    "sampling",
    [Sampling(0.7, 8), Sampling(1.0, 8, top_p=0.8), Sampling(0.0, 8), Sampling(1.5, 8)],
    ids=["t0.7", "t1-top_p0.8", "greedy", "t1.5"],
)
def test_distributions_sum_to_one(engine, sampling):
    out = engine.generate(chat_batch(quickstart_prompts() * 2, seeds(10, "s"), sampling))
    sums = out.distributions.group_by("context").agg(pl.col("probability").sum(), pl.col("agents").first())
    assert sums.height == 5 and (sums["agents"] == 2).all()
    assert (sums["probability"] - 1).abs().max() < 1e-6
    pattern = re.compile(number_regex(0, 100))
    assert all(pattern.fullmatch(a) for a in out.distributions["answer"])
    assert all(pattern.fullmatch(t) for t in out.text) and out.shared_prompt.all()
    if sampling.temperature == 0:  # the argmax path: one answer per prompt, every agent gives it
        assert out.distributions.filter(pl.col("probability") > 0).height == 5
        assert out.distributions.filter(pl.col("probability") > 0)["probability"].to_list() == [1.0] * 5


def spellings(text: str, pieces: dict[str, list[int]]) -> list[tuple[int, ...]]:
    """Every token sequence whose pieces spell ``text`` (brute force over the vocabulary)."""
    if not text:
        return [()]
    out: list[tuple[int, ...]] = []
    for piece, tokens in pieces.items():
        if piece and text.startswith(piece):
            for rest in spellings(text[len(piece):], pieces):
                out += [(t,) + rest for t in tokens]
    return out


def test_each_probability_equals_its_token_paths_evaluated_directly(engine):
    chain = Chain.of(Sampling(0.7, 8))
    dist = shared_distribution(engine, SHORT, Sampling(0.7, 8))
    llm = engine.llm
    vocab = answer_vocab(llm)  # the model's own token texts (what its grammar matches)
    pieces: dict[str, list[int]] = {}
    for token, piece in zip(vocab.ids, vocab.pieces):
        pieces.setdefault(piece, []).append(token)
    language = set(answer_language(0, 100))
    prefixes = {s[:i] for s in language for i in range(len(s) + 1)}
    # The chat-rendered prompt writes its own BOS: none is added (as llama.cpp's chat completion).
    prompt = LlamaCppSharedContext(llm).prompt_tokens(engine.chat_template.render_all(*split_cues([SHORT]))[0], add_bos=False)
    n_vocab = llm.n_vocab()

    memo: dict[tuple[int, ...], np.ndarray] = {}

    def step_logits(path: tuple[int, ...]) -> np.ndarray:
        if path in memo:
            return memo[path]
        llm.reset()  # from scratch: the prompt in one decode, then one decode per answer token
        llm.eval(prompt)
        for t in path:
            llm.eval([t])
        memo[path] = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,)).copy()
        return memo[path]

    def path_probability(path: tuple[int, ...]) -> float:
        prob, text = 1.0, ""
        for i in range(len(path) + 1):
            allowed = sorted([t for piece, ts in pieces.items() if text + piece in prefixes for t in ts]
                             + (list(vocab.eog) if text in language else []))
            z = step_logits(path[:i])[allowed].astype(np.float64)
            # repeat penalty 1.1 on the answer tokens so far, then top-k 40, min-p 0.05, temperature 0.7
            z = np.array([(x * 1.1 if x <= 0 else x / 1.1) if t in path[:i] else x for t, x in zip(allowed, z)])
            keep = np.argsort(-z)[:40]
            keep = keep[z[keep] >= z.max() + math.log(0.05)]
            q = np.zeros(len(z))
            q[keep] = np.exp((z[keep] - z.max()) / 0.7)
            q /= q.sum()
            if i == len(path):
                return prob * sum(q[allowed.index(e)] for e in vocab.eog)
            prob *= q[allowed.index(path[i])]
            if prob == 0:  # cut by top-k or min-p: the rest of the path cannot matter
                return 0.0
            text += llm.detokenize([path[i]]).decode()
        return prob

    assert chain == Chain(0.7, 40, 1.0, 0.05, 1.1)
    likely = sorted((a for a in dist if dist[a] > 0), key=dist.get, reverse=True)
    cut = [a for a in answer_language(0, 100, leading_space=False) if dist.get(a, 0.0) == 0]
    assert len(likely) >= 6 and len(cut) >= 2
    checked = likely[:6] + [cut[0], cut[-1]]  # the likeliest and two the chain cuts to zero
    for answer in checked:
        paths = spellings(answer, pieces) + spellings(" " + answer, pieces)
        direct = 0.0
        for path in paths:
            direct += path_probability(path)
        assert math.isclose(dist.get(answer, 0.0), direct, rel_tol=1e-5, abs_tol=1e-9), (answer, dist.get(answer), direct)
    assert sum(dist[a] for a in likely[:6]) > 0.5


def chi_square(a: np.ndarray, b: np.ndarray) -> tuple[float, int]:
    """Pearson's chi-square of two samples of answers (categories with < 10 in both pooled)."""
    cats, inverse = np.unique(np.concatenate([a, b]), return_inverse=True)
    counts = np.zeros((2, len(cats)))
    np.add.at(counts, (np.repeat([0, 1], [len(a), len(b)]), inverse), 1)
    small = counts.sum(0) < 10
    if small.any():
        counts = np.concatenate([counts[:, ~small], counts[:, small].sum(1, keepdims=True)], axis=1)
    expected = counts.sum(1, keepdims=True) * counts.sum(0, keepdims=True) / counts.sum()
    return float(((counts - expected) ** 2 / expected).sum()), counts.shape[1] - 1


def binned(p: dict[str, float], m: int, q: dict[str, float], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Two exact distributions over the test's categories: answers expected fewer than 10 times
    in ``m`` draws of ``p`` and ``n`` of ``q`` together are pooled into one (as ``chi_square``
    pools the observed counts)."""
    answers = sorted(set(p) | set(q))
    P, Q = (np.array([d.get(a, 0.0) for a in answers]) for d in (p, q))
    small = m * P + n * Q < 10
    P, Q = (np.append(x[~small], x[small].sum()) for x in (P, Q))
    used = m * P + n * Q > 0
    return P[used], Q[used]


def power(p: dict[str, float], m: int, q: dict[str, float], n: int) -> tuple[float, float, int]:
    """The probability that ``chi_square`` rejects at ``ALPHA`` when ``m`` draws follow ``p`` and
    ``n`` follow ``q``, with its noncentrality and degrees of freedom.

    The large-sample law of Pearson's statistic under an alternative: noncentral chi-square with
    noncentrality ``m·n/(m+n) · Σ (p−q)²/π`` (π the pooled distribution).
    """
    P, Q = binned(p, m, q, n)
    pooled = (m * P + n * Q) / (m + n)
    lam = m * n / (m + n) * float(((P - Q) ** 2 / pooled).sum())
    df = len(P) - 1
    return float(ncx2.sf(chi2.isf(ALPHA, df), df, lam)), lam, df


def detectable_tv(p: dict[str, float], m: int, n: int, at_power: float) -> float:
    """The total-variation distance from ``p`` beyond which every alternative is rejected with at
    least ``at_power`` (``m`` draws of ``p`` against ``n`` of the alternative).

    For any distribution q over the same categories, Σ (p−q)²/π ≥ 4·TV(p, q)² (Cauchy–Schwarz,
    π any distribution), so the noncentrality is at least 4·m·n/(m+n)·TV²: the figure solves
    that for the noncentrality the power needs. It is a worst case over the direction of the
    change, for changes between categories; moves of mass among the rare answers that share the
    pooled category are not seen.
    """
    P, _ = binned(p, m, p, n)
    df = len(P) - 1
    critical = chi2.isf(ALPHA, df)
    lam = brentq(lambda x: ncx2.sf(critical, df, x) - at_power, 1e-6, 1e4)
    return math.sqrt(lam / (4 * m * n / (m + n)))


#: Draws per side. The per-agent side (llama.cpp's sampler, grammar over the whole vocabulary,
#: once per agent) is the cost, drawn on both cores; shared draws are nearly free once the
#: distribution is walked.
PER_AGENT_DRAWS, SHARED_DRAWS = 1000, 5000


def per_agent_draws(lo: int, hi: int, m: int, sampling: Sampling) -> list[str]:
    """Draws ``lo..hi`` of ``m`` per-agent draws of TINY, in a fresh process: an engine with
    ``shared_context: false`` (llama.cpp's own sampler and grammar, once per agent)."""
    engine = build_engine(parse_spec({"kind": "llamacpp", "model": MODEL, "num_cpus": 1, "shared_context": False}))
    try:
        out = engine.generate(chat_batch([TINY] * (hi - lo), seeds(m, "per-agent")[lo:hi], sampling, TINY_CONSTRAINT))
    finally:
        engine.close()
    assert out.shared_prompt is None and not any(out.error)  # the per-agent path, every draw answered
    return list(out.text)


@pytest.mark.slow
def test_shared_draws_and_per_agent_draws_are_one_distribution(engine):
    """1,000 per-agent draws of the 0–10 game against 5,000 shared ones, both at T 0.7; then against 5,000 shared
    draws at T 1.0, which must be rejected. Before any draw, the power of the test against T 1.0
    is computed from the two exact distributions and must be at least 0.99, so a sample shrunk
    too far fails here; the total-variation distance detected at this size is printed."""
    m, n = PER_AGENT_DRAWS, SHARED_DRAWS
    sampling, hotter = Sampling(0.7, 8), Sampling(1.0, 8)
    p, q = shared_distribution(engine, TINY, sampling, TINY_CONSTRAINT), shared_distribution(engine, TINY, hotter, TINY_CONSTRAINT)
    tv = 0.5 * sum(abs(p.get(a, 0.0) - q.get(a, 0.0)) for a in set(p) | set(q))
    against_hotter, lam, df = power(p, m, q, n)
    detected = {x: detectable_tv(p, m, n, x) for x in (0.9, 0.99)}
    print(f"\nexact distributions: TV(T 0.7, T 1.0) = {tv:.3f}; power against T 1.0 at alpha {ALPHA} = {against_hotter:.6f} "
          f"(noncentrality {lam:.0f}, df {df}); any change of TV >= {detected[0.9]:.3f} is rejected with power >= 0.9, "
          f">= {detected[0.99]:.3f} with power >= 0.99")
    assert against_hotter >= 0.99

    start = time.perf_counter()
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        parts = [pool.submit(per_agent_draws, lo, hi, m, sampling) for lo, hi in ((0, m // 2), (m // 2, m))]
        a = [text for part in parts for text in part.result()]
    print(f"{m} per-agent draws on two cores: {time.perf_counter() - start:.0f} s")
    shared = engine.generate(chat_batch([TINY] * n, seeds(n, "shared"), sampling, TINY_CONSTRAINT))
    hot = engine.generate(chat_batch([TINY] * n, seeds(n, "shared"), hotter, TINY_CONSTRAINT))
    a, b, c = (np.array(x, dtype=object).astype(str) for x in (a, shared.text, hot.text))
    stat, df = chi_square(a, b)
    print(f"{m} per-agent vs {n} shared draws (T 0.7): chi2 = {stat:.1f}, df = {df}, critical (alpha {ALPHA}) = {chi2.isf(ALPHA, df):.1f}")
    assert stat < chi2.isf(ALPHA, df)
    stat, df = chi_square(a, c)
    print(f"per-agent (T 0.7) vs shared (T 1.0): chi2 = {stat:.1f}, df = {df}, critical = {chi2.isf(ALPHA, df):.1f}")
    assert stat > chi2.isf(ALPHA, df)
