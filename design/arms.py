"""An arm of an experiment: one engine, prompt mode, temperature and game rule.

Every arm of an experiment plays the same personas with the same seeds, so arms are
paired: comparisons between them need no sampling luck. An arm holds an engine spec and
a prompt mode, so it lives above ``engines`` and ``prompts``; it imports neither Prefect
nor Ray (the config models and the Ray actor both hold arms).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import polars as pl

from core.game import GameRule
from core.personas import BACKSTORY
from engines import EngineSpec, SamplingSettings
from engines.mixture import MixtureSpec
from prompts.modes import PromptMode, get_mode


@dataclass(frozen=True)
class Arm:
    """One arm of an experiment: an engine, a prompt mode, a temperature and a rule."""

    index: int
    run_id: str
    engine: EngineSpec | MixtureSpec  # one engine, or several splitting the agents by quota
    prompt_mode: str
    temperature: float
    rule: GameRule
    max_reasoning_tokens: int = 256
    max_answer_tokens: int = 8
    custom: PromptMode | None = None  # a user's own template (arms.prompts mapping)
    sampling: SamplingSettings | None = None  # arms.sampling (None: its defaults)

    @property
    def mode(self) -> PromptMode:
        """The prompt mode: a user's own template, or a built-in mode by name."""
        if self.custom is not None:
            return self.custom
        if self.prompt_mode.endswith(".j2"):  # a user's own template file
            return PromptMode(self.prompt_mode, self.prompt_mode, "cot" in os.path.basename(self.prompt_mode), "custom template")
        return get_mode(self.prompt_mode)


def check_prompt_inputs(arm: Arm, personas: pl.DataFrame) -> None:
    """Refuse an arm whose prompt mode needs what the personas lack (backstories).

    Raises:
        ValueError: one line naming the mode and what is missing.
    """
    if not arm.mode.needs_backstory:
        return
    if BACKSTORY not in personas.columns or personas[BACKSTORY].null_count() == personas.height:
        raise ValueError(
            f"arms.prompts: mode {arm.prompt_mode!r} shows each persona's backstory, but the personas have none "
            "(enable population.backstories, or use the 'persona' mode)"
        )
    missing = personas[BACKSTORY].null_count()
    if missing:
        raise ValueError(f"arms.prompts: mode {arm.prompt_mode!r} needs a backstory for every persona; {missing} have none")
