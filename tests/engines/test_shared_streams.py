"""Shared-context answers with two prompts' answer trees walked side by side, a node of each per
decode in separate KV streams (``SharedContext(streams=2)``, the default), are the
one-node-at-a-time walk's bit for bit, on the real Gemma 3 270M: first-round prompts and
later-round prompts with their history lines. Two engines sharing a pool's answer board split a
batch's prompts between them and answer as one engine alone does."""

from __future__ import annotations

import random
import threading

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling
from engines.board import AnswerBoard
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


def test_two_engines_on_one_board_compute_each_prompt_once_and_answer_as_one_engine_alone(llm):
    """Two shared contexts on the model (two actors of a pool, here two threads), each given the
    same batch at the same moment, as two actors are given shards of round 1: each computes some
    of the distinct prompts and reads the others' from the board; both draw every agent's answer
    as a lone engine does, from the same distributions bit for bit."""
    texts = prompts()
    agents = 3 * len(texts)
    batch = RequestBatch(np.arange(agents), [texts[i % len(texts)] for i in range(agents)],
                         np.arange(agents, dtype=np.int64) * 7919, Sampling(), Constraint(0, 100, True))
    chain = Chain()
    lone = SharedContext(llm)
    alone = lone.generate(batch, chain)
    assert lone.answers.computed == len(texts)
    board = AnswerBoard()
    peers = [SharedContext(llm) for _ in range(2)]
    for owner, peer in enumerate(peers):
        peer.answers.share(board, owner, len(peers))
    out: dict[int, object] = {}
    together = threading.Barrier(2)

    def play(owner: int) -> None:
        together.wait()
        out[owner] = peers[owner].generate(batch, chain)

    threads = [threading.Thread(target=play, args=(owner,)) for owner in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    computed = [peer.answers.computed for peer in peers]
    assert sum(computed) == len(texts) and min(computed) >= 3, computed  # split, none twice
    for owner in range(2):
        assert out[owner].text == alone.text
        assert out[owner].distributions.equals(alone.distributions)
    for peer in (lone, *peers):
        peer.close()
