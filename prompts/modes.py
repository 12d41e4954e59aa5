"""Prompt modes: which template a mode renders and whether it reasons first.

A mode that reasons runs in two phases on every engine: free reasoning from the
rendered template, then the same text + the reasoning + ``FINAL_CUE`` with the
answer constrained. Users can add a mode by pointing at their own template file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent
FINAL_CUE = "\nTherefore, my final number is: "


@dataclass(frozen=True)
class PromptMode:
    """A prompting mode: a Jinja2 template and whether it reasons before answering."""

    name: str
    template: str
    reasoning: bool
    description: str


MODES: dict[str, PromptMode] = {
    m.name: m
    for m in [
        PromptMode("basic", "basic.j2", False, "Report the number directly (paper's P1)."),
        PromptMode("cot", "cot.j2", True, "Think step by step, then answer (paper's P2)."),
    ]
}


def get_mode(name: str) -> PromptMode:
    """The mode of this name; unknown names list the available ones."""
    if name not in MODES:
        raise ValueError(f"unknown prompt mode {name!r}; available: {', '.join(sorted(MODES))}")
    return MODES[name]
