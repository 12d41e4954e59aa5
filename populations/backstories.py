"""The backstory pipeline's plain parts: what a persona's backstory is keyed by, and
how a model's continuation becomes a clean first-person background.

A meta-prompt (``prompts/backstory.j2``) shows a persona's attributes and ends with the
opening words of the backstory; the model continues them. The stored background is
that opening plus the continuation's first paragraph, cut after its last full sentence.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, field_validator

import engines
from core.personas import attribute_columns
from engines import EngineSpec
from prompts.modes import TEMPLATE_DIR

#: The engine backstories use unless the config names another: Gemma 3 270M on llama.cpp.
DEFAULT_BACKSTORY_ENGINE = {"kind": "llamacpp"}


class BackstoryConfig(BaseModel):
    """LLM-written first-person backgrounds for personas (``population.backstories``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Write a backstory for every persona (shown to agents as persona.background).")
    engine: Any = Field(
        default_factory=lambda: dict(DEFAULT_BACKSTORY_ENGINE),
        description="The engine that writes them, a mapping with `kind:` like an arm's engine (default: llamacpp, Gemma 3 270M).",
    )
    template: str = Field("backstory.j2", description="The meta-prompt: a Jinja2 template in prompts/ or a path; variable `persona`.")
    max_tokens: int = Field(96, gt=0, description="Token budget of one backstory.")
    temperature: float = Field(0.8, ge=0, description="Sampling temperature.")
    batch_size: int = Field(32, gt=0, description="Personas per engine call (the unit sent to a Ray worker).")

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, value: Any) -> Any:
        # Validated here so that a bad engine names its field; kept as a mapping when its
        # kind is not installed yet, so a config without backstories never needs it.
        if value == DEFAULT_BACKSTORY_ENGINE:
            return value
        return engines.parse_spec(value).model_dump(mode="json")

    def engine_spec(self) -> EngineSpec:
        """The engine config (raises ValueError naming the available kinds if unknown)."""
        return engines.parse_spec(self.engine)

    def template_path(self) -> Path:
        path = Path(self.template)
        return path if path.is_absolute() or path.exists() else TEMPLATE_DIR / path


_SENTENCE_END = re.compile(r"[.!?](?=[\"')\]]?(\s|$))")


def attributes_json(personas: pl.DataFrame) -> pl.Series:
    """Each persona's attributes as canonical JSON (sorted keys): the persona part of the key."""
    columns = sorted(attribute_columns(personas.columns))
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
