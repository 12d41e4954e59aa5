"""The walk: each tree's nodes evaluated level by level, and the exact distribution they give."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from core.seeds import splitmix64, uniform01
from engines.shared_context.chain import Chain
from engines.shared_context.tree import AnswerTree, Node

if TYPE_CHECKING:
    pass

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


# --------------------------------------------------------------------------- token-id engines
#: ``evaluate(prompts, requests) -> logits``: an engine that takes token ids evaluates each request's
#: node after its prompt's ids (``prompts[i]`` is request ``i``'s prompt).
EvaluateIds = Callable[[list[list[int]], list[NodeRequest]], list[np.ndarray]]


def walk_prompts(ids: Sequence[list[int]], tree: AnswerTree, chain: Chain, max_model_len: int,
                 evaluate: EvaluateIds) -> list[tuple[Distribution, int] | Exception]:
    """Each tokenized prompt's distribution and length, walked together (vLLM in process and over
    HTTP); a prompt whose answer would not fit ``max_model_len`` gets the error instead."""
    ok = [i for i, p in enumerate(ids) if len(p) + tree.max_tokens < max_model_len]
    results: list[tuple[Distribution, int] | Exception] = [
        ValueError(f"prompt of {len(p)} tokens does not fit max_model_len {max_model_len}") for p in ids
    ]
    if ok:
        dists = walk([tree] * len(ok), [chain] * len(ok), lambda rs: evaluate([ids[ok[r.group]] for r in rs], rs))
        for i, d in zip(ok, dists):
            results[i] = (d, len(ids[i]))
    return results


@dataclass(frozen=True)
class Chunk:
    """Part of one node request for an engine that scores at most so many tokens a step:
    request ``request``'s allowed tokens from ``start``, after ``prompt`` (its prompt + path)."""

    request: int
    start: int
    tokens: tuple[int, ...]
    prompt: tuple[int, ...]


def chunks(prompts: Sequence[list[int]], requests: Sequence[NodeRequest], width: int) -> list[Chunk]:
    """Each request's allowed tokens in chunks of at most ``width`` (vLLM's ``logprob_token_ids`` cap)."""
    out: list[Chunk] = []
    for i, (prompt, r) in enumerate(zip(prompts, requests)):
        tokens = r.tokens.tolist()
        for start in range(0, len(tokens), width):
            out.append(Chunk(i, start, tuple(tokens[start : start + width]), tuple(prompt) + r.path))
    return out


def assemble(requests: Sequence[NodeRequest], parts: Sequence[Chunk], steps: Sequence[Mapping[int, float]]) -> list[np.ndarray]:
    """Each request's logits from its chunks' steps (token id → raw logit, one mapping per chunk)."""
    logits = [np.zeros(len(r.tokens), np.float32) for r in requests]
    for part, step in zip(parts, steps):
        logits[part.request][part.start : part.start + len(part.tokens)] = [step[t] for t in part.tokens]
    return logits


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
