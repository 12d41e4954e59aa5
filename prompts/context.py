"""Template variables of a round: the game, the population, the groups, each agent's own.

Shared variables (``game``, ``population``, ``groups``, ``round``, ``history``) are the same
for a whole shard; ``agent_variables`` gives the per-agent ones as a frame, so prompts are
rendered once per distinct context. The game's ``history`` setting decides how much of the
earlier rounds both show (``round_variables``, ``shown_own_guesses``).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from core.game import GameRule, History
from core.personas import PLAY_COLUMNS, attribute_columns, persona_columns

#: Attributes with more distinct values than this (ages, names) are not listed in prompts.
MAX_COMPOSITION_VALUES = 20


def prompt_columns(columns: list[str]) -> tuple[list[str], list[str]]:
    """The columns of the agents' table their prompts are rendered from: persona attributes, and
    what play adds (own guesses, group)."""
    return persona_columns(columns), [c for c in PLAY_COLUMNS if c in columns]


def agent_variables(agents: pl.DataFrame) -> pl.DataFrame:
    """The per-agent template variables: ``persona`` (a struct of attributes) and history."""
    attributes, play = prompt_columns(agents.columns)
    columns = []
    if attributes:
        columns.append(pl.struct(attributes).alias("persona"))
    columns += [pl.col(c) for c in play]
    if not columns:
        return pl.DataFrame({"_": [None] * agents.height})
    return agents.select(columns)


def population_context(personas: pl.DataFrame) -> dict[str, Any]:
    """The ``population`` template variable: the number of players and, for each
    categorical attribute, the count of each value (largest first), e.g. education →
    [{value: "High School", count: "200"}, …]."""
    attributes: dict[str, list[dict[str, str]]] = {}
    for name in attribute_columns(personas.columns):
        if personas.schema[name] not in (pl.String, pl.Categorical, pl.Enum, pl.Boolean):
            continue
        counts = personas[name].drop_nulls().value_counts(sort=True, name="count")
        if 0 < counts.height <= MAX_COMPOSITION_VALUES:
            ordered = counts.sort(["count", name], descending=[True, False])
            attributes[name] = [{"value": str(v), "count": f"{c:,}"} for v, c in ordered.iter_rows()]
    return {"n": f"{personas.height:,}", "attributes": attributes}


def groups_context(personas: pl.DataFrame, history: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The ``groups`` template variable: group → {n: its players, history: its earlier rounds}."""
    sizes = personas.group_by("group").len()
    return {g: {"n": f"{n:,}", "history": history.get(g, [])} for g, n in sizes.iter_rows()}


def shown_own_guesses(agents: pl.DataFrame, history: History) -> pl.DataFrame:
    """The agents with their ``own_guesses`` (oldest first) cut to what ``history`` shows: the
    last N rounds' guesses, or none (the column dropped, so that agents of one persona share a
    prompt and the prompt is rendered once for them)."""
    if "own_guesses" not in agents.columns or history == History():
        return agents
    if not history.own_guesses or history.rounds == 0:
        return agents.drop("own_guesses")
    return agents.with_columns(pl.col("own_guesses").list.tail(history.rounds))


def game_context(rule: GameRule, n_players: int) -> dict[str, Any]:
    """The ``game`` template variable: the rule with numbers formatted for people."""
    return {
        "n_players": f"{n_players:,}",
        "low": f"{rule.low:g}",
        "high": f"{rule.high:g}",
        "ratio": rule.ratio,
        "offset": f"{rule.offset:g}",
        "describe": rule.describe(),
        "integer": rule.integer,
        "rounds": rule.rounds,
    }


def round_variables(
    rule: GameRule, personas: pl.DataFrame, round_: int, history: list[dict[str, Any]],
    group_history: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The shared variables of round ``round_`` (``game``, ``round``, ``history``, ``population``,
    and ``groups`` when the personas have a ``group``): what every prompt of the round sees.

    ``history``: the earlier rounds' outcomes, oldest first; ``group_history``: each group's
    own (nested environments; default: ``history`` for every group). Both are cut to what the
    rule's ``history`` setting shows (every earlier round, or the last N), each entry keeping
    its round number.
    """
    shown = rule.history.shown
    shared: dict[str, Any] = {"game": game_context(rule, personas.height), "round": round_, "history": shown(history),
                              "population": population_context(personas)}
    if "group" in personas.columns:
        if group_history is None:
            group_history = {g: history for g in personas["group"].unique().to_list()}
        shared["groups"] = groups_context(personas, {g: shown(h) for g, h in group_history.items()})
    return shared
