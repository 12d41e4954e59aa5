"""Prompt modes: which template a mode renders and whether it reasons first.

A mode that reasons runs in two phases on every engine: free reasoning from the
rendered template, then the same text + the reasoning + ``FINAL_CUE`` with the
answer constrained. Users add a mode by pointing at their own template file
(``custom_mode``). Each template's header comment lists the variables it uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATE_DIR = Path(__file__).parent
FINAL_CUE = "\nTherefore, my final number is: "


@dataclass(frozen=True)
class PromptMode:
    """A prompting mode: a Jinja2 template and whether it reasons before answering.

    ``needs_backstory`` marks modes that show ``persona.background``: a run refuses to
    start them when the personas have no backstories.
    """

    name: str
    template: str
    reasoning: bool
    description: str
    needs_backstory: bool = False


MODES: dict[str, PromptMode] = {
    m.name: m
    for m in [
        PromptMode("basic", "basic.j2", False, "Report the number directly (the paper's P1)."),
        PromptMode("cot", "cot.j2", True, "Think step by step, then answer (the paper's P2)."),
        PromptMode("cot_rational", "cot_rational.j2", True, "Chain of thought + 'all players are rational' (the paper's P3)."),
        PromptMode("cot_strategic", "cot_strategic.j2", True, "Chain of thought + all players try to guess the others' strategies (the paper's P4)."),
        PromptMode("note", "note.j2", True, "Chain of thought + 'this game is a variation of the famous guess-2/3-of-the-average game' (for other ratios)."),
        PromptMode("persona", "persona.j2", True, "Chain of thought in character: the persona's attributes + 'strictly follow your character'."),
        PromptMode("background", "background.j2", True, "Chain of thought in character: the persona's backstory + 'strictly follow your character' (needs backstories).", True),
        PromptMode("population", "population.j2", True, "Chain of thought, told the composition of the population (e.g. 200 players per education level)."),
    ]
}


def get_mode(name: str) -> PromptMode:
    """The mode of this name; unknown names list the available ones."""
    if name not in MODES:
        raise ValueError(f"unknown prompt mode {name!r}; available: {', '.join(sorted(MODES))}")
    return MODES[name]


def custom_mode(name: str, template: str, reasoning: bool) -> PromptMode:
    """A user's own template as a mode (``arms.prompts: [{name, template, reasoning}]``).

    Raises:
        ValueError: the template file does not exist, or the name shadows a built-in mode.
    """
    path = Path(template).expanduser()
    if not path.is_file():
        raise ValueError(f"template {template!r} not found")
    if name in MODES:
        raise ValueError(f"{name!r} is a built-in mode; give your template another name")
    return PromptMode(name, str(path.resolve()), reasoning, f"custom template {template}")
