"""The answer language of a constrained request, and the vocabulary tokens that can spell it.

An answer is one of finitely many strings (numbers in the game's range, an optional leading
space); the shared-context path takes a constraint only when that language is small enough
to enumerate (``MAX_SHARED_ANSWERS``).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from engines import Constraint

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


def applies(constraint: Constraint | None) -> bool:
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


def read_vocab(path: Path) -> tuple[AnswerVocab, dict] | None:
    """The answer vocabulary kept at ``path`` and what was kept beside it (``write_vocab``'s
    ``extra``), or None if there is none (or it cannot be read)."""
    try:
        data = json.loads(path.read_text())
        vocab = AnswerVocab(tuple(int(i) for i in data["ids"]), tuple(str(p) for p in data["pieces"]), tuple(int(e) for e in data["eog"]))
        return vocab, dict(data.get("extra") or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_vocab(path: Path, answers: AnswerVocab, extra: dict | None = None) -> None:
    """Keep ``answers`` (and ``extra``, JSON) at ``path``, written whole, then renamed: a reader never
    sees half a file; a cache that cannot be written costs only the walk next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.part")
        data = {"ids": list(answers.ids), "pieces": list(answers.pieces), "eog": list(answers.eog)}
        partial.write_text(json.dumps(data | ({"extra": extra} if extra else {})))
        os.replace(partial, path)
    except OSError:
        pass
