"""The answer tree: every token path that spells an allowed answer, as a trie of nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from engines.shared_context.language import AnswerVocab, answer_language

if TYPE_CHECKING:
    from engines import Constraint

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


class AnswerTrees:
    """The answer tree of each (constraint, token budget) over one vocabulary, built once."""

    def __init__(self, vocab: AnswerVocab):
        self.vocab = vocab
        self._trees: dict[tuple[object, int], AnswerTree] = {}

    def __call__(self, constraint: "Constraint", max_tokens: int) -> AnswerTree:
        key = (constraint, max_tokens)
        if key not in self._trees:
            language = answer_language(constraint.low, constraint.high, constraint.integer, leading_space=True)
            self._trees[key] = AnswerTree(language, self.vocab, max_tokens)
        return self._trees[key]
