"""Exact answer distributions: a constrained answer's probabilities, computed instead of sampled.

The answer to a constrained request is one of finitely many strings, so its distribution is a
finite object: the product of the sampling chain's next-token probabilities along every token
path that spells an allowed answer. This module is the engine-independent math (numpy only);
engines supply the next-token logits of the tree's nodes (``walk``'s ``evaluate``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from core.seeds import splitmix64, uniform01
from engines.board import Board, Claims

if TYPE_CHECKING:
    from engines import CompletionBatch, Constraint, RequestBatch, Sampling

#: Characters an answer can contain (numbers, one optional leading space).
ANSWER_CHARS = frozenset(" 0123456789.")
#: Repeat penalty window of llama-cpp-python (``Llama.last_n_tokens_size``'s default).
PENALTY_LAST_N = 64


# --------------------------------------------------------------------------- the language
def answer_language(low: float, high: float, integer: bool = True, leading_space: bool = True) -> list[str]:
    """Every string the answer grammar accepts, numbers in ascending order.

    The same language as ``prompts.answers.number_regex`` (checked against it), each number
    also with one leading space when ``leading_space`` (``number_gbnf``'s default).
    """
    from prompts.answers import number_regex

    lo, hi = math.ceil(low), math.floor(high)
    numbers: list[str] = []
    for i in range(lo, hi + 1):
        numbers.append(str(i))
        if not integer and i < hi:
            numbers += [f"{i}.{d}" for d in range(10)] + [f"{i}.{d:02d}" for d in range(100)]
    pattern = re.compile(number_regex(low, high, integer))
    numbers = [s for s in numbers if pattern.fullmatch(s)]
    numbers.sort(key=lambda s: (float(s), len(s), s))
    return numbers + [" " + s for s in numbers] if leading_space else numbers


#: The widest answer language the shared path enumerates. Integer answers in [0, 100] are 101
#: numbers; any integer range up to 1,000 wide, or decimals over a range up to 9 wide, fit.
#: Wider languages cost many more tree nodes (measured on vLLM CPU: integers in [17, 4321] took
#: 391 s for 24 agents, against 28 s sampled per agent; two-decimal answers over [0, 100] are
#: 11,101 numbers), so those batches take the per-agent path.
MAX_SHARED_ANSWERS = 1000


def answer_count(low: float, high: float, integer: bool = True) -> int:
    """How many numbers the answer grammar allows in [low, high] (without the leading space)."""
    lo, hi = math.ceil(low), math.floor(high)
    if hi < lo:
        return 0
    return hi - lo + 1 + (0 if integer else 110 * (hi - lo))


def shares(constraint: Constraint | None) -> bool:
    """Whether a batch with this constraint takes the shared path (an answer language small
    enough to enumerate, ``MAX_SHARED_ANSWERS``); unconstrained text never does."""
    return constraint is not None and answer_count(constraint.low, constraint.high, constraint.integer) <= MAX_SHARED_ANSWERS


# --------------------------------------------------------------------------- the vocabulary
@dataclass(frozen=True)
class AnswerVocab:
    """The tokens of a model that can appear in an answer, and its end-of-generation tokens.

    Args:
        ids: token ids whose text is made only of ``ANSWER_CHARS``.
        pieces: each token's text (as the grammar sees it).
        eog: the token ids that end generation (EOS, end-of-turn…).
    """

    ids: tuple[int, ...]
    pieces: tuple[str, ...]
    eog: tuple[int, ...]

    @classmethod
    def from_pieces(cls, pieces: Sequence[bytes | str], eog: Sequence[int]) -> "AnswerVocab":
        """Filter a whole vocabulary (token id → its bytes) once, keeping answer tokens."""
        ids: list[int] = []
        texts: list[str] = []
        eog_set = set(int(e) for e in eog)
        for token, piece in enumerate(pieces):
            if token in eog_set or not piece:
                continue
            text = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else piece
            if set(text) <= ANSWER_CHARS:
                ids.append(token)
                texts.append(text)
        return cls(tuple(ids), tuple(texts), tuple(sorted(eog_set)))


# --------------------------------------------------------------------------- the tree
@dataclass
class Node:
    """A token path from the prompt: its text, its children and, once walked, its probability."""

    path: tuple[int, ...]
    text: str
    children: list[tuple[int, "Node | None"]] = field(default_factory=list)  # (token, child); None = EOG
    prob: float = 0.0  # of reaching this node
    step: np.ndarray | None = None  # the chain's probability of each child, once walked

    @property
    def needs_logits(self) -> bool:
        """Only a node with a choice needs the model: one allowed token has probability 1, and
        several end-of-generation tokens all end the same answer."""
        tokens = [c for _, c in self.children if c is not None]
        return bool(tokens) and len(self.children) > 1


class AnswerTree:
    """Every token path the grammar accepts, from the prompt to an end of generation.

    A node's children are the tokens whose text keeps it a prefix of an allowed string, plus
    every end-of-generation token where it is an allowed string — what llama.cpp's grammar
    sampler allows: every tokenisation (multi-digit tokens, split digits, byte tokens alike).
    A path of ``max_tokens`` tokens ends there (the request's length limit), as the per-agent
    path would. Children are found when a walk reaches a node (``expand``) and kept by text:
    the full tree of a real-valued answer has millions of paths, the walked part a few dozen.
    """

    def __init__(self, language: Sequence[str], vocab: AnswerVocab, max_tokens: int):
        self.max_tokens = max_tokens
        self.eog = vocab.eog
        self.accepted = set(language)
        self.prefixes = {s[:i] for s in language for i in range(len(s) + 1)}
        self.by_piece: dict[str, list[int]] = {}
        for token, piece in zip(vocab.ids, vocab.pieces):
            if piece:
                self.by_piece.setdefault(piece, []).append(token)
        self._children: dict[str, list[tuple[int, str | None]]] = {}

    build = classmethod(lambda cls, language, vocab, max_tokens: cls(language, vocab, max_tokens))

    def children_of(self, text: str) -> list[tuple[int, str | None]]:
        """(token, the child's text, or None for an end of generation), by token id."""
        if text not in self._children:
            out: list[tuple[int, str | None]] = [(e, None) for e in self.eog] if text in self.accepted else []
            for piece, tokens in self.by_piece.items():
                if text + piece in self.prefixes:
                    out += [(t, text + piece) for t in tokens]
            self._children[text] = sorted(out, key=lambda c: c[0])
        return self._children[text]

    def expand(self, node: Node) -> Node:
        if not node.children and len(node.path) < self.max_tokens:
            node.children = [(t, None if c is None else Node(node.path + (t,), c)) for t, c in self.children_of(node.text)]
        return node

    @property
    def root(self) -> Node:
        """A fresh root (walks mark probabilities on their own nodes)."""
        return self.expand(Node((), ""))

    def nodes(self) -> list[Node]:
        """Every node of the whole tree (small trees only: tests)."""
        out, stack = [], [self.root]
        while stack:
            node = self.expand(stack.pop())
            out.append(node)
            stack += [c for _, c in reversed(node.children) if c is not None]
        return out


# --------------------------------------------------------------------------- the chain
class AnswerTrees:
    """The answer tree of each (constraint, token budget) over one vocabulary, built once."""

    def __init__(self, vocab: AnswerVocab):
        self.vocab = vocab
        self._trees: dict[tuple[object, int], AnswerTree] = {}

    def __call__(self, constraint: "Constraint", max_tokens: int) -> AnswerTree:
        key = (constraint, max_tokens)
        if key not in self._trees:
            language = answer_language(constraint.low, constraint.high, constraint.integer, leading_space=True)
            self._trees[key] = AnswerTree.build(language, self.vocab, max_tokens)
        return self._trees[key]


@dataclass(frozen=True)
class Chain:
    """llama.cpp's sampling chain as llama-cpp-python 0.3 builds it, the documented semantics.

    Order: repeat penalty (over the tokens generated so far, last 64) → grammar mask →
    top-k → top-p → min-p → temperature → draw. Top-p and min-p see the probabilities at
    temperature 1 (they come before the temperature); temperature 0 takes the argmax of the
    penalised, masked logits (lowest token id on ties). ``top_k = 0`` and ``top_p = 1`` and
    ``min_p = 0`` and ``repeat_penalty = 1`` switch a step off.
    """

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 1.0
    min_p: float = 0.05
    repeat_penalty: float = 1.1

    @classmethod
    def of(cls, sampling: Sampling) -> Chain:
        """The chain of a batch's ``Sampling`` (the same knobs, on every engine)."""
        return cls(sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.repeat_penalty)

    def probabilities(self, tokens: np.ndarray, logits: np.ndarray, previous: Sequence[int] = ()) -> np.ndarray:
        """Next-token probabilities over the allowed ``tokens`` (sorted ids) given their raw
        ``logits`` and the tokens generated before this step."""
        z = np.asarray(logits, np.float32).copy()
        if self.repeat_penalty != 1.0 and previous:
            seen = np.isin(tokens, np.asarray(previous[-PENALTY_LAST_N:]))
            # llama.cpp's fix of the CTRL penalty: negative logits are multiplied.
            z[seen] = np.where(z[seen] <= 0, z[seen] * np.float32(self.repeat_penalty), z[seen] / np.float32(self.repeat_penalty))
        z64 = z.astype(np.float64)
        p = np.zeros(len(z64))
        if self.temperature <= 0:
            p[int(np.argmax(z64))] = 1.0  # argmax takes the first maximum: the lowest id
            return p
        keep = np.ones(len(z64), bool)
        if 0 < self.top_k < len(z64):
            keep[np.argsort(-z64, kind="stable")[self.top_k:]] = False
        if self.top_p < 1.0:
            q = np.where(keep, np.exp(z64 - z64[keep].max()), 0.0)
            q /= q.sum()
            order = np.argsort(-q, kind="stable")
            cut = int(np.searchsorted(np.cumsum(q[order]), self.top_p)) + 1  # first cum >= top_p
            mask = np.zeros(len(z64), bool)
            mask[order[:cut]] = True
            keep &= mask
        if self.min_p > 0:
            keep &= z64 >= z64[keep].max() + math.log(self.min_p)
        scaled = z64 / self.temperature
        q = np.where(keep, np.exp(scaled - scaled[keep].max()), 0.0)
        return q / q.sum()


# --------------------------------------------------------------------------- the walk
@dataclass(frozen=True)
class NodeRequest:
    """One node whose next-token logits an engine must compute: group, path, allowed tokens."""

    group: int
    path: tuple[int, ...]
    tokens: np.ndarray


#: ``evaluate(requests) -> logits``: raw logits of each request's allowed tokens, in order.
Evaluate = Callable[[list[NodeRequest]], list[np.ndarray]]


@dataclass(frozen=True)
class Distribution:
    """The exact distribution of one group's answer.

    ``leaves`` are the token paths that end an answer, in a canonical order (depth first,
    by token id), with their probabilities and answer texts (stripped, as stored);
    ``answers``/``probs`` sum them per answer, in ascending order of the number.
    """

    leaf_text: tuple[str, ...]
    leaf_tokens: np.ndarray  # completion tokens of each leaf (EOG not counted)
    leaf_prob: np.ndarray
    answers: tuple[str, ...]
    probs: np.ndarray
    evaluated: int  # nodes whose logits the model computed

    def draw(self, seeds: np.ndarray) -> np.ndarray:
        """Leaf index per agent: inverse CDF at a uniform from each agent's own seed, so a draw
        depends only on the seed and the distribution (not on batch, shard or order)."""
        u = uniform01(splitmix64(np.asarray(seeds, np.uint64) ^ np.uint64(0x5EEDA45E)))
        cdf = np.cumsum(self.leaf_prob)
        index = np.searchsorted(cdf, u * cdf[-1], side="right")
        return np.minimum(index, len(cdf) - 1)

    @property
    def expected(self) -> float:
        return float(np.dot([float(a) for a in self.answers], self.probs))

    def frame(self, context: str, agents: int) -> Any:
        """The rows stored in ``answer_distributions`` for one group: context, answer,
        probability, agents (a polars frame)."""
        import polars as pl

        return pl.DataFrame({"context": context, "answer": list(self.answers), "probability": self.probs, "agents": agents},
                            schema_overrides={"agents": pl.Int64})


class Walker:
    """One group's walk of its answer tree, fed logits as an engine computes them.

    Level by level: every node reached with a positive probability that has a choice is
    asked for (``asks``); once each has its logits (``give``), the next level is expanded.
    Subtrees of probability 0 (cut by top-k, top-p, min-p or the argmax) are never asked
    for — exact, and the reason a whole tree costs a few model calls.
    """

    def __init__(self, tree: AnswerTree, chain: Chain):
        self.tree, self.chain = tree, chain
        self.root = tree.root
        self.root.prob = 1.0
        self.evaluated = 0
        self._level = [self.root]
        self.asks: list[Node] = []
        self._settle({})

    @property
    def done(self) -> bool:
        return not self._level

    def give(self, logits: dict[int, np.ndarray]) -> None:
        """The raw logits of the allowed tokens of every node asked for, by ``id(node)``."""
        self._settle(logits)

    def _settle(self, computed: dict[int, np.ndarray]) -> None:
        """Resolve the current level with ``computed``, then go down until a level asks for logits."""
        while self._level:
            for node in self._level:
                self.tree.expand(node)
            asks = [n for n in self._level if n.needs_logits]
            if any(id(n) not in computed for n in asks):
                self.asks = asks
                return
            nxt: list[Node] = []
            for node in self._level:
                if node.needs_logits:
                    self.evaluated += 1
                    tokens = np.array([t for t, _ in node.children], np.int64)
                    p = self.chain.probabilities(tokens, computed[id(node)], node.path)
                else:
                    eog = [c is None for _, c in node.children]
                    p = np.full(len(node.children), 1.0 / max(1, sum(eog))) if all(eog) else np.array([1.0 if c is not None else 0.0 for _, c in node.children])
                for (token, child), q in zip(node.children, p):
                    if child is not None and q > 0:
                        child.prob = node.prob * q
                        nxt.append(child)
                node.step = p
            self._level, computed = nxt, {}
        self.asks = []

    def distribution(self) -> "Distribution":
        assert self.done, "the walk is not finished"
        return _collect(self.root, self.evaluated)


def walk(trees: Sequence[AnswerTree], chains: Sequence[Chain], evaluate: Evaluate) -> list[Distribution]:
    """The exact answer distribution of each group (one tree and chain per group): every
    group's ``Walker`` asks are sent to ``evaluate`` together, so batching engines run them at once."""
    walkers = [Walker(t, c) for t, c in zip(trees, chains)]
    while not all(w.done for w in walkers):
        asks = [(g, n) for g, w in enumerate(walkers) for n in w.asks]
        logits = evaluate([NodeRequest(g, n.path, np.array([t for t, _ in n.children], np.int64)) for g, n in asks])
        computed: list[dict[int, np.ndarray]] = [{} for _ in walkers]
        for (g, n), z in zip(asks, logits):
            computed[g][id(n)] = z
        for w, c in zip(walkers, computed):
            if not w.done:
                w.give(c)
    return [w.distribution() for w in walkers]


def _collect(root: Node, evaluated: int) -> Distribution:
    texts: list[str] = []
    tokens: list[int] = []
    probs: list[float] = []
    stack = [root]
    while stack:
        node = stack.pop()
        p = node.step
        if not node.children:  # the length limit: the text so far is the answer
            if node.prob > 0:
                texts.append(node.text.strip()), tokens.append(len(node.path)), probs.append(node.prob)
            continue
        stop = sum(q for (_, c), q in zip(node.children, p) if c is None) if p is not None else 0.0
        if stop > 0:
            texts.append(node.text.strip()), tokens.append(len(node.path)), probs.append(node.prob * stop)
        stack += [c for (_, c), q in reversed(list(zip(node.children, p))) if c is not None and q > 0]
    leaf_prob = np.array(probs)
    totals: dict[str, float] = {}
    for t, q in zip(texts, probs):
        totals[t] = totals.get(t, 0.0) + q
    answers = sorted(totals, key=lambda s: (float(s) if s else -math.inf, s))
    return Distribution(tuple(texts), np.array(tokens, np.int64), leaf_prob, tuple(answers),
                        np.array([totals[a] for a in answers]), evaluated)


# --------------------------------------------------------------------------- a batch
def context_hash(prompt: str, chain: Chain, low: float, high: float, integer: bool, max_tokens: int) -> str:
    """A short stable key of one group: the prompt and everything its distribution depends on."""
    import hashlib

    blob = "\x1f".join([prompt, repr(chain), f"{low:g}", f"{high:g}", str(integer), str(max_tokens)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: ``compute(prompts) -> [(distribution, prompt tokens) or the exception that prevented it]``.
#: An engine's distributions of a batch's prompts: each (distribution, prompt tokens), or what
#: prevented it; with ``Claims`` (a pool's board), None for a prompt another engine claimed.
Compute = Callable[[list[str], "Claims | None"], list["tuple[Distribution, int] | Exception | None"]]


class SharedAnswers:
    """Answers a constrained batch from exact distributions: one per distinct prompt.

    Agents are grouped by prompt (the batch shares sampling and constraint); each group's
    distribution is computed once (and kept, ``cache_size`` of them, for later shards: it
    is a function of the prompt alone) and every agent draws its answer with its own seed.
    With a ``board`` (``engines.board``: the engine is one of a pool's), each distribution is
    computed by one engine of the pool: this one claims prompts as it goes and reads the rest.
    """

    def __init__(self, cache_size: int = 4096):
        self.cache_size = cache_size
        self._cache: dict[str, tuple[Distribution, int]] = {}
        self.board: Board | None = None
        self.owner = 0  # this engine's rank in its pool
        self.start = 0.0  # where in a batch's sorted prompts it begins claiming (rank / pool size)
        self.computed = 0  # distributions this engine computed (not read from its cache or its pool)

    def share(self, board: Board, owner: int, peers: int) -> None:
        """Share distributions with a pool of ``peers`` engines through ``board``; this is ``owner``."""
        self.board, self.owner, self.start = board, owner, owner / max(peers, 1)

    def _keep(self, key: str, found: tuple[Distribution, int]) -> None:
        if len(self._cache) >= self.cache_size:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = found

    def complete(self, batch: "RequestBatch", chain: Chain, compute: Compute) -> "CompletionBatch":
        import time

        import polars as pl

        from engines import CompletionBatch

        c = batch.constraint
        assert c is not None, "shared answers need a constraint"
        max_tokens = batch.sampling.max_tokens
        n = len(batch)
        frame = pl.DataFrame({"prompt": pl.Series(list(batch.prompt), dtype=pl.String)}).with_row_index("row")
        groups = frame.group_by("prompt").agg("row").sort("prompt")
        prompts: list[str] = groups["prompt"].to_list()
        keys = [context_hash(p, chain, c.low, c.high, c.integer, max_tokens) for p in prompts]
        todo = [i for i, k in enumerate(keys) if k not in self._cache]
        start = time.perf_counter()
        failed: dict[str, str] = {}
        asked = [prompts[i] for i in todo]
        claims = Claims(self.board, self.owner, [keys[i] for i in todo], self.start) if self.board is not None and todo else None
        results = compute(asked, claims) if todo else []
        if claims is not None:  # the prompts other engines of the pool claimed, as they publish them
            theirs = claims.others()
            results = [theirs.get(j, result) if result is None else result for j, result in enumerate(results)]
            # A claim not published in time (its engine died): computed here.
            missing = [j for j, result in enumerate(results) if result is None]
            for j, result in zip(missing, compute([asked[j] for j in missing], None) if missing else []):
                results[j] = result
            here = claims.mine | set(missing)
        else:
            here = set(range(len(todo)))
        self.computed += sum(isinstance(results[j], tuple) for j in here)
        for i, result in zip(todo, results):
            if isinstance(result, Exception):
                failed[keys[i]] = f"{type(result).__name__}: {result}".splitlines()[0][:500]
            elif result is not None:
                self._keep(keys[i], result)
        seconds = time.perf_counter() - start
        text = np.empty(n, object)
        prompt_tokens = np.zeros(n, np.int64)
        completion_tokens = np.zeros(n, np.int64)
        context = np.empty(n, object)
        seeds = np.asarray(batch.seed)
        error: list[str | None] = [None] * n
        rows_out = []
        for key, rows in zip(keys, groups["row"].to_list()):
            rows = np.asarray(rows, np.int64)
            if key in failed:
                text[rows] = ""
                for r in rows.tolist():
                    error[r] = failed[key]
                continue
            dist, tokens = self._cache[key]
            leaf = dist.draw(seeds[rows])
            text[rows] = np.asarray(dist.leaf_text, object)[leaf]
            completion_tokens[rows] = dist.leaf_tokens[leaf]
            prompt_tokens[rows] = tokens
            context[rows] = key
            rows_out.append(dist.frame(key, len(rows)))
        distributions = pl.concat(rows_out) if rows_out else None
        return CompletionBatch(
            text=text.tolist(),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            # The batch's compute time, shared equally: the latencies of a shard sum to its time.
            latency_s=np.full(n, seconds / max(n, 1)),
            attempts=np.ones(n, np.int64),
            error=error,
            shared_prompt=np.ones(n, bool),
            context=context.tolist(),
            distributions=distributions,
        )
