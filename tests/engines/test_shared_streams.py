"""Shared-context answers with two prompts' answer trees walked side by side, a node of each per
decode in separate KV streams (``SharedContext(streams=2)``, the default), are the
one-node-at-a-time walk's bit for bit, on the real Gemma 3 270M: first-round prompts and
later-round prompts with their history lines."""

from __future__ import annotations

import random

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from engines import Constraint
from engines.exact import Chain
from engines.llamacpp_internals import quiet
from engines.llamacpp_shared import STREAMS, SharedContext
from prompts.context import game_context
from prompts.render import render

pytestmark = pytest.mark.llm

EDUCATION = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]


@pytest.fixture(scope="module")
def llm(gguf):
    from llama_cpp import Llama

    with quiet():
        model = Llama(model_path=str(gguf), n_ctx=1024, n_threads=1, n_threads_batch=1, seed=0, verbose=False)
    yield model
    model.close()


def prompts() -> list[str]:
    rule = GameRule(rounds=5)
    rng = random.Random(3)
    first = render("basic.j2", {"game": game_context(rule, 1000), "round": 1, "history": []},
                   pl.DataFrame({"persona": [{"education": e} for e in EDUCATION]}))
    history = [{"round": 1, "mean": 41.3, "winning_guess": 27}, {"round": 2, "mean": 30.2, "winning_guess": 20}]
    later = [render("basic.j2", {"game": game_context(rule, 1000), "round": 3, "history": history,
                                 "own_guesses": [rng.randint(0, 100), rng.randint(0, 100)]},
                    pl.DataFrame({"persona": [{"education": rng.choice(EDUCATION)}]}))[0] for _ in range(6)]
    return sorted(set(first)) + sorted(set(later))


def test_two_streams_give_the_one_stream_walks_distributions_bit_for_bit(llm):
    assert STREAMS == 2
    chain = Chain()  # the defaults: T 0.7, top-k 40, min-p 0.05, repeat penalty 1.1
    texts = prompts()
    assert len(texts) == 11 and any("you named" in t for t in texts)
    results = {}
    for streams in (1, 2):
        shared = SharedContext(llm, streams=streams)
        tree = shared.tree(Constraint(0, 100, True), 8)
        if streams == 1:  # one prompt after another
            results[streams] = [shared.distribution(t, tree, chain)[0] for t in texts]
        else:  # all at once: two prompts' trees walked side by side
            results[streams] = [found[0] for found in shared.distributions(texts, tree, chain)]
        assert shared.tokens_evaluated >= shared.tokens_bound > 0
        shared.close()
    nodes = 0
    for one, two in zip(results[1], results[2]):
        assert one.answers == two.answers
        assert np.array_equal(one.probs, two.probs), float(np.abs(one.probs - two.probs).max())
        assert one.evaluated == two.evaluated
        nodes += one.evaluated
    assert nodes > 3 * len(texts)  # trees of several nodes: pairs of rows were decoded
