"""Prompt evaluation in fixed blocks, for llama.cpp's exact paths (shared-context answers,
engines/llamacpp/shared_context.py, and chain of thought's streams, engines/llamacpp/batch.py).

A decode's logits depend on how its tokens were split into batches; evaluating every prompt in
blocks at fixed positions, whatever prefix a cache already holds, makes every logit a function of
the prompt alone.
"""

from __future__ import annotations

from typing import Iterator, Sequence

#: Prompt tokens are evaluated in blocks at fixed positions (0, BLOCK, 2·BLOCK, …), whatever
#: prefix is already cached: every decode, and so every logit, is then a function of the prompt
#: alone — not of which prompts a shard held before it — and draws reproduce across shardings.
#: 16 rather than 32: a prompt that differs from the cached one re-evaluates up to 15 tokens it
#: shares, not 31 (later rounds, where prompts differ at an agent's own earlier guess: 1.09x the
#: trie bound on 371 round-3 prompts, against 1.22x with 32). On Gemma 3 270M here, blocks of
#: 16, 32, 64 or 128 tokens give the logits of the whole prompt in one decode bit for bit; blocks
#: of 8, or of 32 starting at 8, do not (docs/benchmarks.md).
BLOCK = 16


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def resume_point(held: Sequence[int], seq: Sequence[int], prompt_length: int) -> int:
    """How many of ``seq``'s tokens to keep from the ``held`` KV before evaluating the rest:
    their common prefix less ``seq``'s last token (its logits are needed), and, inside the
    prompt (its first ``prompt_length`` tokens), back to a block boundary, so that the prompt's
    decodes are always the same."""
    keep = min(common_prefix(held, seq), len(seq) - 1)
    if keep < prompt_length:
        keep -= keep % BLOCK
    return keep


def prompt_blocks(start: int, end: int) -> Iterator[tuple[int, int]]:
    """The (from, to) ranges that evaluate prompt positions ``start``…``end`` in fixed blocks
    (``start`` on a block boundary or past the prompt's last full block)."""
    while start < end:
        stop = min(end, (start // BLOCK + 1) * BLOCK)
        yield start, stop
        start = stop
