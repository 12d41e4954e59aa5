"""What an agent sees in round r: the round's shared variables and each agent's own variables.

One function for the play stage (the stored history and own guesses), the budget check (the
widest numbers an agent can be shown) and ``keynes plan`` (a plausible history): what
``game.history`` shows of earlier rounds and of an agent's own guesses is decided here.
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from core.game import GameRule
from prompts.context import round_variables, shown_own_guesses


def seen(rule: GameRule, personas: pl.DataFrame, round_: int, history: list[dict[str, Any]],
         own_guesses: pl.DataFrame | Sequence[float] | None = None, agents: pl.DataFrame | None = None,
         group_history: dict[str, list[dict[str, Any]]] | None = None) -> tuple[dict[str, Any], pl.DataFrame]:
    """The shared variables of round ``round_`` and the agents' frame, as the templates see them.

    Args:
        rule: the arm's game rule (its ``history`` says what is shown).
        personas: the whole population (the ``population`` variable counts it).
        round_: the round played.
        history: the earlier rounds' outcomes, oldest first (``core.game.history_row``).
        own_guesses: each agent's earlier guesses, oldest first: a frame of ``agent_id,
            own_guesses`` (joined), or one list for every agent.
        agents: the agents shown (default: every persona).
        group_history: each group's own outcomes (nested environments).
    """
    agents = personas if agents is None else agents
    if isinstance(own_guesses, pl.DataFrame):
        agents = agents.join(own_guesses, on="agent_id", how="left")
    elif own_guesses is not None:
        agents = agents.with_columns(own_guesses=pl.Series([list(own_guesses)] * agents.height, dtype=pl.List(pl.Float64)))
    return round_variables(rule, personas, round_, history, group_history), shown_own_guesses(agents, rule.history)
