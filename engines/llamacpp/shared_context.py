"""The llama.cpp side of shared-context answers: tree-node logits from the prompt's KV state.

Each node of a prompt's answer tree is evaluated from the longest prefix kept in a KV stream
(the prompt, then one token per tree edge), so a distinct prompt costs its tokens plus a few
single-token decodes, and sorted prompts share prefixes. Two prompts' trees are walked side by
side in streams of their own (``STREAMS``), a node of each per decode, with the hidden state the
model's own context gives each node alone; only the answer tokens' logits are computed from it
(``engines.llamacpp.head``: llama.cpp's own arithmetic, within float noise of its full logits).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from engines import CompletionBatch, RequestBatch
from engines.llamacpp.batch import Sequences
from engines.llamacpp.blocks import common_prefix, prompt_blocks, resume_point
from engines.llamacpp.head import OutputHead
from engines.llamacpp.internals import adds_bos, adds_eos, cached_tokens, drop_cache_from, eval_without_logits, last_logits, too_long, vocab
from engines.models import cache_dir
from engines.shared_context import (
    ANSWER_CHARS,
    AnswerTree,
    AnswerTrees,
    AnswerVocab,
    Chain,
    Distribution,
    Node,
    NodeRequest,
    SharedContextAnswers,
    Walker,
    walk,
)
from engines.shared_context.board import Claims
from engines.shared_context.language import read_vocab, write_vocab

#: Answer-tree nodes decoded together, each in its own KV stream. Measured on Gemma 3 270M, one
#: thread, a decode of 1, 2, 3 rows: 21, 50, 87 ms with the full output layer; 9.1, 13.0, 19.4 ms
#: with the answer tokens' rows alone (``engines.llamacpp.head``, the default). 1–3 rows in
#: separate streams (without flash attention) are bit for bit the rows the model's own context
#: decodes one at a time, while 4 or more are not (llama.cpp's repacked Q4_K kernels take over), so two.
STREAMS = 2

#: Per process, by model file: read by every engine built in the process on that file (each
#: actor's, a second context's) and changed by none, so no engine's lifetime should bound them.
_VOCABS: dict[str, AnswerVocab] = {}
_HEADS: dict[str, OutputHead | None] = {}
#: What a vocabulary cache file holds (``vocab_cache_path``); a new layout gets a new number.
_VOCAB_FORMAT = 1


def answer_vocab(llm: Any) -> AnswerVocab:
    """The model's answer tokens and end-of-generation tokens, computed once per model file: a
    walk over its whole vocabulary through ctypes (~1 s for Gemma's 262,144 tokens), kept on disk
    (``vocab_cache_path``) for every later process, and in memory for this one."""
    import llama_cpp

    key = str(llm.model_path)
    if key not in _VOCABS:
        cache = vocab_cache_path(Path(key))
        found = read_vocab(cache)
        if found is not None:
            _VOCABS[key] = found[0]
            return found[0]
        handle = vocab(llm)
        n = llm.n_vocab()
        buf = ctypes.create_string_buffer(64)
        pieces: list[bytes] = []
        eog: list[int] = []
        for token in range(n):
            # special=True: the text llama.cpp's grammar sampler matches each token by.
            size = llama_cpp.llama_token_to_piece(handle, token, buf, len(buf), 0, True)
            pieces.append(buf.raw[:size] if size > 0 else b"")
            if llama_cpp.llama_vocab_is_eog(handle, token):
                eog.append(token)
        _VOCABS[key] = AnswerVocab.from_pieces(pieces, eog)
        write_vocab(cache, _VOCABS[key])
    return _VOCABS[key]


def gguf_tokens(model: Path, text: str) -> tuple[AnswerVocab, list[int]]:
    """A GGUF's answer vocabulary (``answer_vocab``) and the tokens it evaluates for ``text`` as a
    prompt (``prompt_tokens``), from its vocabulary alone (the weights are not loaded): what a server
    of that file must agree with."""
    from llama_cpp import Llama

    llm = Llama(str(model), vocab_only=True, verbose=False)
    try:
        return answer_vocab(llm), prompt_tokens(llm, text)
    finally:
        llm.close()


def output_head(llm: Any) -> OutputHead | None:
    """The model's output layer for the answer tokens' logits alone (``engines.llamacpp.head``),
    read once per model file and process; None where that path does not apply."""
    key = str(llm.model_path)
    if key not in _HEADS:
        _HEADS[key] = OutputHead.load(key, llm.n_embd())
    return _HEADS[key]


def vocab_cache_path(model: Path) -> Path:
    """Where ``model``'s answer vocabulary is kept: ``$KEYNES_CACHE/vocab/<digest>.json``, the digest
    of the model file's sha256, llama-cpp-python's version (how it spells tokens) and
    ``ANSWER_CHARS`` (a keynes whose answers may hold other characters filters again). The sha256 is the file's ``.sha256`` stamp (engines/models.py)
    while the stamp vouches for the file's size and modification time; a file without one is
    named by its resolved path, size and modification time instead (hashing a model of several
    GB would cost more than the walk it saves)."""
    info = model.stat()
    try:
        stamp = json.loads(model.with_name(model.name + ".sha256").read_text())
        stamped = stamp["size"] == info.st_size and stamp["mtime_ns"] == info.st_mtime_ns
        identity = f"sha256:{stamp['sha256']}" if stamped else None
    except (OSError, ValueError, KeyError, TypeError):
        identity = None
    identity = identity or f"file:{model.resolve()}:{info.st_size}:{info.st_mtime_ns}"
    import llama_cpp

    digest = hashlib.sha256(f"{_VOCAB_FORMAT}|{identity}|{llama_cpp.__version__}|{''.join(sorted(ANSWER_CHARS))}".encode()).hexdigest()
    return cache_dir().parent / "vocab" / f"{digest}.json"


def prompt_tokens(llm: Any, prompt: str, add_bos: bool = True) -> list[int]:
    """The tokens ``create_completion`` evaluates for this prompt (BOS, text with special tokens)."""
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    bos = [llm.token_bos()] if add_bos and adds_bos(llm) and llm.token_bos() != -1 else []
    eos = [llm.token_eos()] if adds_eos(llm) else []
    return bos + tokens + eos


@dataclass
class _Walk:
    """One prompt's walk in a stream: its Walker, the nodes of its level still to decode, their
    logits so far, and the tokens to decode before the next node's logits."""

    index: int
    prompt: list[int]
    walker: Walker
    asks: list[Node]
    computed: dict[int, np.ndarray] = field(default_factory=dict)
    feed: list[int] = field(default_factory=list)


class LlamaCppSharedContext:
    """Exact answer distributions on a loaded ``llama_cpp.Llama``.

    With ``streams`` > 1 (the default), each prompt is evaluated in the source stream of a
    second context on the same weights (``engines.llamacpp.batch.Sequences``, the model's own
    attention settings) and its tree's nodes are decoded ``streams`` at a time, each in a stream
    of its own that holds the prompt (copied) and the node's path; with ``streams=1``, in the
    model's own context, one node after another. Both give the same logits bit for bit
    (``STREAMS``; tests/engines/test_shared_streams.py compares them).
    """

    def __init__(self, llm: Any, streams: int = STREAMS, head: bool = True):
        self.llm = llm
        self.streams = streams
        self.head = head
        self._sequences: Sequences | None = None  # the streams' context, made at the first prompt
        self._slot_kv: list[list[int]] = [[] for _ in range(streams)]
        self.vocab = answer_vocab(llm)
        self.n_vocab = llm.n_vocab()
        self.answers = SharedContextAnswers()
        self.tree = AnswerTrees(self.vocab)
        #: Tokens decoded so far (prompt blocks and tree paths), and the least that could have
        #: been: each distinct prompt's edges in the trie of the prompts computed so far (its
        #: tokens past the prefix it shares with the previous one) plus one token per answer-tree
        #: node after the root.
        self.tokens_evaluated = 0
        self.tokens_bound = 0
        self._last: list[int] = []

    def prepare(self) -> None:
        """Make the streams' context now and check its head (``engines.llamacpp.head``) on a short
        prompt, rather than at the first prompt: an engine does it while it waits for work."""
        if self.streams > 1 and self._sequences is None:
            self._sequences = Sequences(self.llm, self.streams, self.llm.n_ctx(), self.llm.context_params.n_threads, flash_attention=False,
                                        head=output_head(self.llm) if self.head else None)
            self._sequences._evaluate(self.prompt_tokens("0"))

    def generate(self, batch: RequestBatch, chain: Chain, add_bos: bool = True) -> CompletionBatch:
        """The batch's answers from the exact distribution of each distinct prompt.

        ``add_bos``: whether llama.cpp adds the model's BOS token before each prompt, as
        ``create_completion`` does for plain text (a chat-rendered prompt writes its own).
        """
        assert batch.constraint is not None
        tree = self.tree(batch.constraint, batch.sampling.max_tokens)

        def compute(prompts: list[str], claims: Claims | None) -> list[tuple[Distribution, int] | Exception | None]:
            return self.distributions(prompts, tree, chain, add_bos, claims)

        return self.answers.complete(batch, chain, compute)

    def prompt_tokens(self, prompt: str, add_bos: bool = True) -> list[int]:
        return prompt_tokens(self.llm, prompt, add_bos)

    def distribution(self, prompt: str, tree: AnswerTree, chain: Chain, add_bos: bool = True) -> tuple[Distribution, int]:
        """One prompt's exact distribution and its token count (raises what prevented it)."""
        found = self.distributions([prompt], tree, chain, add_bos)[0]
        if isinstance(found, Exception):
            raise found
        return found

    def distributions(self, prompts: list[str], tree: AnswerTree, chain: Chain, add_bos: bool = True,
                      claims: Claims | None = None) -> list[tuple[Distribution, int] | Exception | None]:
        """Each prompt's exact distribution and token count, or the exception that prevented it
        (a prompt longer than the context: that prompt only). Sorted prompts evaluate from the
        previous one's kept prefix. With ``claims`` (``engines.shared_context.board``), only the prompts this
        engine claims, one at a time as it gets to them, published as they are done; the others
        are None."""
        tokens = [self.prompt_tokens(p, add_bos) for p in prompts]
        out: list[tuple[Distribution, int] | Exception | None] = [
            too_long(len(t), self.llm.n_ctx()) for t in tokens]
        fits = sorted((i for i, t in enumerate(tokens) if len(t) + tree.max_tokens < self.llm.n_ctx()), key=lambda i: tokens[i])
        queue = claims.order(fits) if claims is not None else list(fits)
        for i in fits:
            out[i] = None

        def take() -> int | None:
            return claims.take(queue) if claims is not None else queue.pop(0) if queue else None

        def done(i: int, dist: Distribution) -> None:
            out[i] = (dist, len(tokens[i]))
            if claims is not None:
                claims.publish(i, out[i])

        if self.streams > 1:
            self._walk_in_streams(tokens, take, done, tree, chain)
        else:
            while (i := take()) is not None:
                done(i, self._walk_one(tokens[i], tree, chain))
        for i in fits:  # the trie bound of what this engine computed, in its order
            found = out[i]
            if isinstance(found, tuple):
                self.tokens_bound += max(1, len(tokens[i]) - common_prefix(self._last, tokens[i])) + found[0].evaluated - 1
                self._last = tokens[i]
        return out

    def _walk_one(self, tokens: list[int], tree: AnswerTree, chain: Chain) -> Distribution:
        """One prompt's walk in the model's own context, one node after another."""
        def evaluate(requests: list[NodeRequest]) -> list[np.ndarray]:
            return [self.logits(tokens, r.path)[r.tokens] for r in requests]

        return walk([tree], [chain], evaluate)[0]

    def logits(self, prompt: list[int], path: tuple[int, ...]) -> np.ndarray:
        """The next-token logits after ``prompt + path`` (a copy of the full vocabulary row)."""
        llm = self.llm
        seq = prompt + list(path)
        keep = resume_point(cached_tokens(llm), seq, len(prompt))
        if keep < llm.n_tokens and not drop_cache_from(llm, keep):
            llm.reset()
            keep = 0
        llm.n_tokens = keep
        self.tokens_evaluated += len(seq) - keep
        # The prompt block by block, then the tree path one token per decode (as the per-agent
        # path runs it); only the last decode computes logits (the KV is the same either way).
        steps = [*prompt_blocks(keep, len(prompt)), *((pos, pos + 1) for pos in range(max(keep, len(prompt)), len(seq)))]
        for start, end in steps[:-1]:
            eval_without_logits(llm, seq[start:end])
        start, end = steps[-1]
        llm.eval(seq[start:end])
        row = last_logits(llm, self.n_vocab)
        return row.copy()

    def _walk_in_streams(self, prompts: list[list[int]], take: Callable[[], int | None],
                         done: Callable[[int, Distribution], None], tree: AnswerTree, chain: Chain) -> None:
        """The walks of the prompts ``take`` gives (an index into ``prompts``, until None),
        ``streams`` at a time, each handed to ``done`` when finished: each prompt is evaluated in
        the source stream (in order: from the previous one's kept prefix) and copied into a free
        stream, where its tree is walked one node per step (a node's siblings reuse the prompt's
        KV); every step decodes one row in each busy stream, so the streams' nodes share the cost
        of reading the weights. A row's logits are the same whatever the other stream decodes
        (``STREAMS``)."""
        self.prepare()
        seq = self._sequences
        assert seq is not None
        decoded = seq.decoded
        live: list[_Walk | None] = [None] * self.streams
        more = True  # whether ``take`` may give another prompt
        while more or any(live):
            for slot in range(self.streams):  # one new prompt a step: the source is copied at the next decode
                if live[slot] is not None or not more:
                    continue
                i = take()
                if i is None:
                    more = False
                    break
                root = seq._evaluate(prompts[i])
                walker = Walker(tree, chain)
                if walker.asks and not walker.asks[0].path:  # the root's logits, from the source
                    walker.give({id(n): root[[t for t, _ in n.children]] for n in walker.asks})
                if walker.done:
                    done(i, walker.distribution())
                    continue  # nothing copied: the source may change again
                seq.take(slot)
                self._slot_kv[slot] = list(prompts[i])
                live[slot] = _Walk(i, prompts[i], walker, list(walker.asks))
                break
            rows, reads = [], []
            for slot, w in enumerate(live):
                if w is None:
                    continue
                kv = self._slot_kv[slot]
                if not w.feed:  # aim at its next node: keep what the stream holds of its path
                    w.feed = seq.aim(slot, kv, w.prompt + list(w.asks[0].path))
                token = w.feed.pop(0)
                rows.append((token, len(kv), slot))
                kv.append(token)
                reads.append(slot if not w.feed else -1)
            if not rows:
                continue
            seq._decode(rows, logits=[slot >= 0 for slot in reads])
            for k, slot in enumerate(reads):
                if slot < 0:
                    continue
                w = live[slot]
                assert w is not None
                node = w.asks.pop(0)
                w.computed[id(node)] = seq._row(k)[[t for t, _ in node.children]].copy()
                if not w.asks:
                    w.walker.give(w.computed)
                    w.computed = {}
                    if w.walker.done:
                        done(w.index, w.walker.distribution())
                        live[slot] = None
                    else:
                        w.asks = list(w.walker.asks)
        self.tokens_evaluated += seq.decoded - decoded

    def close(self) -> None:
        """Free the streams' context (the model stays loaded)."""
        if self._sequences is not None:
            self._sequences.close()
            self._sequences = None
            self._slot_kv = [[] for _ in range(self.streams)]
