"""The backstory pipeline's plain parts: what a persona's backstory is keyed by, and
how a model's continuation becomes a clean first-person background.

A meta-prompt (``prompts/backstory.j2``) shows a persona's attributes and ends with the
opening words of the backstory; the model continues them. The stored background is
that opening plus the continuation's first paragraph, cut after its last full sentence.
"""

from __future__ import annotations

import hashlib
import json
import re

import numpy as np
import polars as pl

#: Persona columns that are not attributes (never part of a backstory's key or prompt).
NOT_ATTRIBUTES = ("agent_id", "background", "experiment_id", "own_guesses", "group")

_SENTENCE_END = re.compile(r"[.!?](?=[\"')\]]?(\s|$))")


def attribute_columns(personas: pl.DataFrame) -> list[str]:
    """The attribute columns of a personas frame (band columns included: they are derived)."""
    return [c for c in personas.columns if c not in NOT_ATTRIBUTES]


def attributes_json(personas: pl.DataFrame) -> pl.Series:
    """Each persona's attributes as canonical JSON (sorted keys): the persona part of the key."""
    columns = sorted(attribute_columns(personas))
    if not columns:
        return pl.Series("attributes", ["{}"] * personas.height, dtype=pl.String)
    return personas.select(pl.struct(columns).struct.json_encode().alias("attributes")).to_series()


def template_hash(source: str) -> str:
    """A short hash of a template's text: a changed meta-prompt gets new backstories."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def cache_keys(
    attributes: pl.Series, template: str, model: str, seeds: np.ndarray, temperature: float, max_tokens: int
) -> pl.Series:
    """One key per persona: sha256 of (attributes, template hash, model, seed, sampling)."""
    tail = f"\x1f{template}\x1f{model}\x1f{temperature!r}\x1f{max_tokens}\x1f"
    keys = [
        hashlib.sha256(f"{a}{tail}{s}".encode()).hexdigest() for a, s in zip(attributes.to_list(), np.asarray(seeds).tolist())
    ]
    return pl.Series("key", keys, dtype=pl.String)


def opening(prompt: str) -> str:
    """The opening words of the backstory: the meta-prompt's last line."""
    return prompt.rstrip("\n").rsplit("\n", 1)[-1].strip()


def clean_backstory(prompt: str, completion: str) -> str:
    """The background: the prompt's opening plus the first paragraph of the continuation,
    whitespace collapsed, cut after its last full sentence (token limits stop mid-sentence)."""
    paragraph = re.split(r"\n\s*\n", completion.strip(), maxsplit=1)[0] if completion.strip() else ""
    paragraph = " ".join(paragraph.split())
    ends = [m.end() for m in _SENTENCE_END.finditer(paragraph)]
    if ends:
        paragraph = paragraph[: ends[-1]]
    start = opening(prompt)
    glue = "" if not paragraph or paragraph[0] in ",.;:!?" else " "
    return f"{start}{glue}{paragraph}".strip()
