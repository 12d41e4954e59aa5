"""Which columns of a personas frame are demographic attributes, in one place.

A personas frame carries identity columns, demographic attributes, an optional free-text
backstory, and (at play time) per-agent context joined on for the prompt. Prompts,
backstory keys, population composition and the demographic SQL views all ask the same
question of it: these helpers answer it once.
"""

from __future__ import annotations

from typing import Iterable

#: Columns that identify a persona rather than describe it.
ID_COLUMNS = ("experiment_id", "agent_id")
#: Free text about a persona, shown only by the prompt modes that ask for it.
BACKSTORY = "background"
#: Per-agent context joined onto the personas when a round is played.
PLAY_COLUMNS = ("own_guesses", "group")
#: Every column that is not a demographic attribute.
NOT_ATTRIBUTES = (*ID_COLUMNS, BACKSTORY, *PLAY_COLUMNS)


def attribute_columns(columns: Iterable[str]) -> list[str]:
    """The demographic attribute columns, in their order (band columns included)."""
    return [c for c in columns if c not in NOT_ATTRIBUTES]


def persona_columns(columns: Iterable[str]) -> list[str]:
    """What a prompt's ``persona`` variable holds: the attributes and the backstory, in their order."""
    return [c for c in columns if c not in ID_COLUMNS and c not in PLAY_COLUMNS]
