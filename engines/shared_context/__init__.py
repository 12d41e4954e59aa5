"""Shared context: exact answer distributions, one per distinct prompt, and every agent's own seeded draw.

The answer to a constrained request is one of finitely many strings, so its distribution is a
finite object: the product of the sampling chain's next-token probabilities along every token
path that spells an allowed answer. This package is that math, engine-free (numpy only):
the answer language (``language``), its tree of token paths (``tree``), the sampling chain
(``chain``), the walk that evaluates the tree (``walk``), a batch answered from the
distributions (``answers``) and a pool's board where engines share them (``board``). Engines
supply the next-token logits of the tree's nodes (``walk``'s ``evaluate``):
``engines.llamacpp.shared_context`` and ``engines.vllm.shared_context``.
"""

from __future__ import annotations

from engines.shared_context.answers import Compute, SharedContextAnswers, context_hash, prompt_groups
from engines.shared_context.board import KEEP, WAIT_S, AnswerBoard, Board, Claims
from engines.shared_context.chain import Chain
from engines.shared_context.language import ANSWER_CHARS, MAX_SHARED_ANSWERS, PENALTY_LAST_N, AnswerVocab, answer_count, answer_language, applies
from engines.shared_context.tree import AnswerTree, AnswerTrees, Node
from engines.shared_context.walk import Chunk, Distribution, Evaluate, EvaluateIds, NodeRequest, Walker, assemble, chunks, walk, walk_prompts

__all__ = ['ANSWER_CHARS', 'AnswerBoard', 'AnswerTree', 'AnswerTrees', 'AnswerVocab', 'Board', 'Chain', 'Chunk', 'Claims', 'Compute', 'Distribution', 'Evaluate', 'EvaluateIds', 'KEEP', 'MAX_SHARED_ANSWERS', 'Node', 'NodeRequest', 'PENALTY_LAST_N', 'SharedContextAnswers', 'WAIT_S', 'Walker', 'answer_count', 'answer_language', 'applies', 'assemble', 'chunks', 'context_hash', 'prompt_groups', 'walk', 'walk_prompts']
