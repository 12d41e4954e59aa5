"""The exact-distribution math on a small hand-made vocabulary (no model): language, tree, chain, draws."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

from engines import Constraint
from engines.shared_context import MAX_SHARED_ANSWERS, AnswerTree, AnswerVocab, Chain, answer_count, answer_language, applies, walk
from prompts.answers import number_regex

pytestmark = pytest.mark.quick

# A Llama-3-like vocabulary: single digits, multi-digit tokens, a space, space+digit tokens,
# a token no answer can use, and two end-of-generation tokens (ids 0 and 1).
PIECES = ["<eos>", "<eot>", " ", "0", "1", "2", "5", "10", "12", "100", " 1", " 10", "abc", "25", "."]
EOG = [0, 1]


def vocab() -> AnswerVocab:
    return AnswerVocab.from_pieces([p.encode() for p in PIECES], EOG)


def spellings(text: str, pieces: dict[str, int]) -> list[tuple[int, ...]]:
    """Every token sequence spelling ``text`` (brute force, independent of the tree)."""
    if not text:
        return [()]
    out = []
    for piece, token in pieces.items():
        if text.startswith(piece):
            out += [(token,) + rest for rest in spellings(text[len(piece):], pieces)]
    return out


def test_the_language_is_number_regex_with_an_optional_space():
    for low, high, integer in [(0, 100, True), (10, 250, True), (0, 1, False)]:
        language = answer_language(low, high, integer)
        pattern = re.compile(number_regex(low, high, integer))
        bare = [s for s in language if not s.startswith(" ")]
        assert all(pattern.fullmatch(s) for s in bare)
        assert len(set(language)) == len(language) == 2 * len(bare)
    assert len(answer_language(0, 100)) == 202
    assert len(answer_language(0, 1, False)) == 2 * (1 + 10 + 100 + 1)


def test_the_tree_holds_every_tokenisation_of_every_answer():
    v = vocab()
    language = [s for s in answer_language(0, 100) if set(s) <= set(" 0125")]
    tree = AnswerTree(language, v, max_tokens=8)
    leaves = set()
    for node in tree.nodes():
        if any(c is None for _, c in node.children):
            leaves.add(node.path)
    pieces = {p: i for i, p in enumerate(PIECES) if i not in EOG and p != "abc" and p != "."}
    expected = {path for s in language for path in spellings(s, pieces)}
    assert leaves == expected
    assert (11,) in leaves and (2, 4, 3) in leaves and (10, 3) in leaves  # " 10" alone, " "+"1"+"0", " 1"+"0"


def test_probabilities_are_products_along_paths_and_sum_to_one():
    v = vocab()
    language = [s for s in answer_language(0, 100) if set(s) <= set(" 0125")]
    tree = AnswerTree(language, v, max_tokens=8)
    rng = np.random.default_rng(0)
    table = rng.normal(size=(64, len(PIECES))).astype(np.float32)

    def logits_of(path):
        return table[hash(path) % 64]

    def evaluate(requests):
        return [logits_of(r.path)[r.tokens] for r in requests]

    chain = Chain(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.3)
    dist = walk([tree], [chain], evaluate)[0]
    assert abs(dist.probs.sum() - 1) < 1e-12
    # Independent: multiply the renormalised, penalised step probabilities of every spelling.
    pieces = {p: i for i, p in enumerate(PIECES) if i not in EOG and p not in ("abc", ".")}
    prefixes = {s[:i] for s in language for i in range(len(s) + 1)}
    for answer, p in zip(dist.answers, dist.probs):
        total = 0.0
        for s in (answer, " " + answer):
            for path in spellings(s, pieces):
                prob, text = 1.0, ""
                for i in range(len(path) + 1):
                    allowed = [t for t, piece in enumerate(PIECES) if t not in EOG and piece in pieces and text + piece in prefixes]
                    allowed += EOG if text in language else []
                    allowed.sort()
                    z = logits_of(path[:i])[allowed].astype(np.float64)
                    z = np.array([(x * 1.3 if x <= 0 else x / 1.3) if t in path[:i] else x for t, x in zip(allowed, z)])
                    q = np.exp(z / 0.8) / np.exp(z / 0.8).sum()
                    if i == len(path):
                        prob *= sum(q[allowed.index(e)] for e in EOG)
                    else:
                        prob *= q[allowed.index(path[i])]
                        text += PIECES[path[i]]
                total += prob
        assert math.isclose(p, total, rel_tol=1e-5), (answer, p, total)


def test_the_chain_follows_llama_cpp():
    tokens = np.arange(5)
    z = np.array([3.0, 2.0, 1.0, 0.0, -5.0], np.float32)
    assert Chain(temperature=0.0).probabilities(tokens, z).tolist() == [1, 0, 0, 0, 0]
    # min-p at temperature 1: keeps p_i >= 0.05 p_max, i.e. logits >= 3 + ln 0.05 = 0.004
    p = Chain(temperature=1.0, top_k=0, min_p=0.05, repeat_penalty=1.0).probabilities(tokens, z)
    assert (p[3:] == 0).all() and math.isclose(p[:3].sum(), 1)
    assert Chain(temperature=1.0, top_k=2, min_p=0.0).probabilities(tokens, z)[2:].sum() == 0
    # top-p keeps the smallest head whose mass reaches p (here the first two: 0.644 + 0.237)
    p = Chain(temperature=2.0, top_k=0, top_p=0.85, min_p=0.0).probabilities(tokens, z)
    assert (p[2:] == 0).all() and math.isclose(p[0] / p[1], math.exp(0.5))
    # the repeat penalty divides a positive logit and multiplies a negative one
    p = Chain(temperature=1.0, top_k=0, min_p=0.0, repeat_penalty=2.0).probabilities(tokens, z, previous=[0, 4])
    ref = np.exp([1.5, 2.0, 1.0, 0.0, -10.0])
    assert np.allclose(p, ref / ref.sum())


def test_draws_follow_the_seed_only():
    v = vocab()
    tree = AnswerTree([s for s in answer_language(0, 100) if set(s) <= set(" 0125")], v, max_tokens=8)
    dist = walk([tree], [Chain(temperature=1.0, top_k=0, min_p=0.0)], lambda rs: [np.zeros(len(r.tokens), np.float32) for r in rs])[0]
    seeds = np.arange(20_000, dtype=np.uint64) * 7919
    leaves = dist.draw(seeds)
    assert (dist.draw(seeds[::-1]) == leaves[::-1]).all()
    assert all((dist.draw(seeds[i : i + 7]) == leaves[i : i + 7]).all() for i in range(0, 100, 7))
    freq = np.bincount(leaves, minlength=len(dist.leaf_prob)) / len(seeds)
    assert np.abs(freq - dist.leaf_prob).max() < 0.01
    assert set(itertools.chain(dist.leaf_text)) == set(dist.answers)


def test_the_shared_path_takes_answer_languages_it_can_enumerate():
    for low, high, integer in [(0, 100, True), (0, 1, False), (17, 4321, True), (2.5, 7.5, False), (0, 100, False)]:
        assert answer_count(low, high, integer) == len(answer_language(low, high, integer, leading_space=False))
    assert applies(Constraint(0, 100, True)) and applies(Constraint(0, 1, False)) and applies(Constraint(0, 999, True))
    assert answer_count(17, 4321, True) == 4305 > MAX_SHARED_ANSWERS and not applies(Constraint(17, 4321, True))
    assert answer_count(0, 100, False) == 11_101 > MAX_SHARED_ANSWERS and not applies(Constraint(0, 100, False))
    assert not applies(None)
