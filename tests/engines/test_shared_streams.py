"""Shared-context answers with two prompts' answer trees walked side by side, a node of each per
decode in separate KV streams (``LlamaCppSharedContext(streams=2)``, the default), are the
one-node-at-a-time walk's, on the real Gemma 3 270M: first-round prompts and later-round prompts
with their history lines; bit for bit with the full output layer, within float noise with the
answer tokens' rows alone (``engines.llamacpp.head``), which the checks here compare with
llama.cpp's own logits. Two engines sharing a pool's answer board split a batch's prompts between
them and answer as one engine alone does."""

from __future__ import annotations

import random
import threading

import numpy as np
import polars as pl
import pytest

from core.game import GameRule
from engines import Constraint, RequestBatch, Sampling
from engines.llamacpp.internals import quiet
from engines.llamacpp.shared_context import STREAMS, LlamaCppSharedContext
from engines.shared_context import Chain
from engines.shared_context.board import AnswerBoard
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


def test_two_streams_give_the_one_stream_walks_distributions(llm):
    """Bit for bit with the full output layer; within 1e-5 with the answer rows alone (the
    default), which the first prompt checked and trusted."""
    assert STREAMS == 2
    chain = Chain.of(Sampling())  # the defaults: T 0.7, top-k 40, min-p 0.05, repeat penalty 1.1
    texts = prompts()
    assert len(texts) == 11 and any("you named" in t for t in texts)
    results = {}
    for streams, head in ((1, False), (2, False), (2, True)):
        shared = LlamaCppSharedContext(llm, streams=streams, head=head)
        tree = shared.tree(Constraint(0, 100, True), 8)
        if streams == 1:  # one prompt after another, in the model's own context
            results[streams, head] = [shared.distribution(t, tree, chain)[0] for t in texts]
        else:  # all at once: two prompts' trees walked side by side
            results[streams, head] = [found[0] for found in shared.distributions(texts, tree, chain)]
            assert shared._sequences._hidden.trusted if head else shared._sequences._hidden is None
        assert shared.tokens_evaluated >= shared.tokens_bound > 0
        shared.close()
    nodes = 0
    for one, two, rows in zip(results[1, False], results[2, False], results[2, True]):
        assert one.answers == two.answers == rows.answers
        assert np.array_equal(one.probs, two.probs), float(np.abs(one.probs - two.probs).max())
        assert np.abs(one.probs - rows.probs).max() < 1e-5
        assert not np.array_equal(one.probs, rows.probs) or one.probs.size == 1  # the rows alone really computed them
        assert one.evaluated == two.evaluated == rows.evaluated
        nodes += one.evaluated
    assert nodes > 3 * len(texts)  # trees of several nodes: pairs of rows were decoded


def test_the_answer_rows_alone_are_llama_cpps_logits_and_a_wrong_head_is_not_trusted(llm, gguf):
    """Two prompts decoded a token at a time side by side in two streams, with and without the
    head: every row's logits of the 64 likeliest tokens (and of 64 others) within 1e-4 of
    llama.cpp's. A head whose matrix is off by one row fails the first prompt's check, and that
    context computes the full logits from then on (the same as without a head, bit for bit)."""
    from engines.llamacpp.batch import Sequences
    from engines.llamacpp.head import HeadRow, OutputHead
    from engines.llamacpp.shared_context import prompt_tokens

    head = OutputHead.load(gguf, llm.n_embd())
    assert head is not None and head.blocks.shape == (llm.n_vocab(), llm.n_embd() // 32)
    wrong = OutputHead(np.roll(head.blocks, 1, axis=0), head.n_embd)
    texts = prompts()[:2]
    ids = [prompt_tokens(llm, t) for t in texts]
    follow = [llm.tokenize(b" 33 and then 25", add_bos=False), llm.tokenize(b" I will say 50", add_bos=False)]
    seqs = {name: Sequences(llm, 2, 1024, 1, flash_attention=False, head=h) for name, h in (("full", None), ("head", head), ("wrong", wrong))}
    rows: dict[str, list[np.ndarray | HeadRow]] = {name: [] for name in seqs}
    for name, seq in seqs.items():
        for slot, prompt in enumerate(ids):
            root = seq._evaluate(prompt)
            rows[name].append(root if name == "head" else np.array(root[range(llm.n_vocab())]))
            seq.take(slot)  # the copy is made at the next decode: before the source changes
            seq._decode([(follow[slot][0], len(prompt), slot)], logits=[False])
        for step in range(1, min(map(len, follow))):
            seq._decode([(follow[s][step], len(ids[s]) + step, s) for s in range(2)], logits=[True, True])
            rows[name] += [seq._row(k) if name == "head" else np.array(seq._row(k)[range(llm.n_vocab())]) for k in range(2)]
    assert seqs["head"]._hidden.trusted and not seqs["wrong"]._hidden.trusted
    rng = np.random.default_rng(0)
    for full, fast, fallback in zip(rows["full"], rows["head"], rows["wrong"]):
        assert np.array_equal(full, fallback)
        tokens = np.concatenate([np.argsort(-full)[:64], rng.integers(0, llm.n_vocab(), 64)])
        assert isinstance(fast, HeadRow)
        assert np.abs(fast[tokens] - full[tokens]).max() < 1e-4
    assert len(rows["full"]) >= 8
    for seq in seqs.values():
        seq.close()


def test_two_engines_on_one_board_compute_each_prompt_once_and_answer_as_one_engine_alone(llm):
    """Two shared contexts on the model (two actors of a pool, here two threads), each given the
    same batch at the same moment, as two actors are given shards of round 1: each computes some
    of the distinct prompts and reads the others' from the board; both draw every agent's answer
    as a lone engine does, from the same distributions bit for bit."""
    texts = prompts()
    agents = 3 * len(texts)
    batch = RequestBatch(np.arange(agents), [texts[i % len(texts)] for i in range(agents)],
                         np.arange(agents, dtype=np.int64) * 7919, Sampling(), Constraint(0, 100, True))
    chain = Chain.of(Sampling())
    lone = LlamaCppSharedContext(llm)
    alone = lone.generate(batch, chain)
    assert lone.answers.computed == len(texts)
    board = AnswerBoard()
    peers = [LlamaCppSharedContext(llm) for _ in range(2)]
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
