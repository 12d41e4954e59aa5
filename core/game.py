"""The game: rules of the p-beauty contest and the outcome of one round.

Plain Python on polars frames — no Prefect, Ray or DuckDB — so the arithmetic that
decides winners is easy to test against independent computations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


def parse_fraction(value: object) -> Fraction:
    """Read "2/3", "0.5", 0.5 or 1 as an exact fraction; raise ValueError otherwise."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a fraction")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if isinstance(value, str):
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError):
            pass
    raise ValueError(f"{value!r} is not a fraction")


#: What a prompt is told of an earlier round (``history``'s entries; the ``rounds`` table's columns).
HISTORY_FIELDS = ("round", "n", "n_valid", "mean", "median", "target", "winning_guess", "n_winners")


def history_row(round_: int, n: int, mean: float, target: float, n_winners: int) -> dict[str, float | int]:
    """An earlier round as a prompt is told it, from the few numbers that decide its text (all of
    ``n`` agents valid, the median at the mean, the winning guess at the target)."""
    return dict(zip(HISTORY_FIELDS, (round_, n, n, mean, mean, target, target, n_winners)))


class History(BaseModel):
    """What agents are told of earlier rounds (from round 2): every earlier round or the last
    ``rounds`` of them, each with or without the agent's own guess in it.

    A researcher may write the whole mapping, ``{rounds: 2, own_guesses: false}``, or just the
    rounds: ``history: all``, ``history: 2``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int | Literal["all"] = Field(
        "all", description='The earlier rounds shown: "all", or the last N (0: none, only the round number).'
    )
    own_guesses: bool = Field(True, description="Tell each agent the number it named in each round shown.")

    @model_validator(mode="before")
    @classmethod
    def _rounds_alone(cls, value: object) -> object:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return {"rounds": value}
        if not isinstance(value, (dict, History)):
            raise ValueError(f"{value!r}: expected all, a number of rounds, or {{rounds: all | N, own_guesses: true | false}}")
        return value

    @field_validator("rounds", mode="before")
    @classmethod
    def _all_or_count(cls, value: object) -> int | str:
        if isinstance(value, str) and value.strip().lower() == "all":
            return "all"
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise ValueError(f"{value!r}: expected all or a number of rounds (0 or more)")

    def shown(self, past: list) -> list:
        """The part of the earlier rounds (oldest first) that agents are told."""
        if self.rounds == "all":
            return past
        return past[len(past) - self.rounds:] if self.rounds else []

    def own_guesses_in(self, round_: int) -> int:
        """How many of an agent's own earlier guesses its prompt of ``round_`` holds."""
        if round_ == 1 or not self.own_guesses or self.rounds == 0:
            return 0
        return round_ - 1 if self.rounds == "all" else min(round_ - 1, self.rounds)

    def describe(self) -> str:
        """The setting in words, e.g. "every earlier round, with own guesses"."""
        if self.rounds == 0:
            return "no earlier round (only the round number)"
        rounds = "every earlier round" if self.rounds == "all" else f"the last {self.rounds} round" + "s" * (self.rounds > 1)
        return f"{rounds}, {'with' if self.own_guesses else 'without'} own guesses"


class GameRule(BaseModel):
    """The rule of one game: players name a number in [low, high]; the target is
    ratio × mean + offset (clamped to the bounds); the nearest guesses win. ``history``
    sets what players are told of earlier rounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: str = Field("2/3", description='The multiplier of the mean, as an exact fraction such as "2/3" or "51/100".')
    offset: float = Field(0.0, description='Added to ratio × mean: the paper\'s "5 + 1/2 of the average" has offset 5.')
    low: float = Field(0.0, ge=0, description="The smallest number a player may name.")
    high: float = Field(100.0, description="The largest number a player may name.")
    rounds: int = Field(1, ge=1, description="How many rounds are played; each round's outcome is shown in the next.")
    answers: Literal["integer", "real"] = Field("integer", description="Whether players name integers or real numbers (up to two decimals).")
    tolerance: float = Field(0.0, ge=0, description="Guesses within this distance of the target also win (the paper used 0.5); 0 means only the nearest win.")
    history: History = Field(
        default_factory=History,
        description="What agents are told of earlier rounds: {rounds: all | N (the last N), own_guesses: true | false}.",
    )

    @field_validator("ratio", mode="before")
    @classmethod
    def _exact_ratio(cls, value: object) -> str:
        fraction = parse_fraction(value)
        if fraction < 0:
            raise ValueError(f"{value!r} is negative")
        if fraction >= 2**1023:  # targets are computed in floats
            raise ValueError(f"{value!r} is too large")
        return str(fraction)

    @model_validator(mode="after")
    def _bounds(self) -> "GameRule":
        if self.high <= self.low:
            raise ValueError(f"high ({self.high:g}) must be above low ({self.low:g})")
        return self

    @property
    def fraction(self) -> Fraction:
        return Fraction(self.ratio)

    @property
    def integer(self) -> bool:
        return self.answers == "integer"

    @property
    def equilibrium(self) -> float:
        """The Nash equilibrium: the fixed point x = clamp(ratio × x + offset).

        For ratio < 1 it is unique, offset / (1 − ratio) clamped to [low, high]: 0 for
        2/3, 10 for "5 + 1/2 of the average". For ratio ≥ 1 it is ``high``: everyone
        naming the upper bound is an equilibrium (the only one reached by iterated best
        responses from inside the range when ratio > 1 or offset > 0).
        """
        if self.fraction >= 1:
            return self.high
        # Clamped exactly, then made a float: a huge offset gives `high`, not an OverflowError.
        return float(_clamp(Fraction(self.offset) / (1 - self.fraction), Fraction(self.low), Fraction(self.high)))

    def target(self, mean: float) -> float:
        """ratio × mean + offset, clamped to [low, high]."""
        return _clamp(float(self.fraction) * mean + self.offset, self.low, self.high)

    def best_response(self, believed_mean: float) -> float:
        """The number a player names who believes the mean will be ``believed_mean``
        (the target they expect, ignoring their own weight in the mean: a large population)."""
        return self.target(believed_mean)

    def with_overrides(self, **changes: object) -> "GameRule":
        """A validated copy with some fields changed (the arms' ``games`` entries)."""
        return GameRule.model_validate({**self.model_dump(), **changes})

    def describe(self) -> str:
        """The rule in words, e.g. "2/3 of the average" or "5 + 1/2 of the average"."""
        core = f"{self.ratio} of the average"
        return f"{_fmt(self.offset)} + {core}" if self.offset else core


class GameOverride(BaseModel):
    """Some fields of a game rule, changed for some arms (``arms.games``); the rest come
    from the experiment's ``game``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ratio: str | None = Field(None, description="The multiplier of the mean, an exact fraction.")
    offset: float | None = Field(None, description="Added to ratio × mean.")
    low: float | None = Field(None, ge=0, description="The smallest number a player may name.")
    high: float | None = Field(None, description="The largest number a player may name.")
    rounds: int | None = Field(None, ge=1, description="How many rounds are played.")
    answers: Literal["integer", "real"] | None = Field(None, description="integer or real answers.")
    tolerance: float | None = Field(None, ge=0, description="Guesses this near the target also win.")

    @field_validator("ratio", mode="before")
    @classmethod
    def _exact_ratio(cls, value: object) -> str | None:
        return None if value is None else GameRule._exact_ratio(value)

    def apply(self, rule: GameRule) -> GameRule:
        """The rule with these fields changed (validated as a whole)."""
        return rule.with_overrides(**self.model_dump(exclude_none=True))


@dataclass(frozen=True)
class RoundOutcome:
    """The outcome of one round over the valid guesses."""

    n: int
    n_valid: int
    mean: float | None
    median: float | None
    std: float | None
    target: float | None
    winning_guess: float | None
    winners: np.ndarray = field(repr=False)  # agent ids, sorted

    @property
    def n_winners(self) -> int:
        return len(self.winners)

    @property
    def invalid_rate(self) -> float:
        return 1 - self.n_valid / self.n if self.n else 0.0


def outcome(guesses: pl.DataFrame, rule: GameRule) -> RoundOutcome:
    """Aggregate one round: statistics of the valid guesses, the target, the winners.

    Args:
        guesses: columns ``agent_id``, ``guess`` (null when invalid) and ``valid``.
        rule: the game rule.

    Winners are every agent whose valid guess is nearest the target (ties all win), plus
    those within ``rule.tolerance`` of it. ``winning_guess`` is the nearest guess (the
    smaller one when two are equally near). ``std`` is the sample standard deviation.
    """
    valid = guesses.filter(pl.col("valid") & pl.col("guess").is_not_null()).select("agent_id", "guess")
    n, n_valid = guesses.height, valid.height
    if n_valid == 0:
        return RoundOutcome(n, 0, None, None, None, None, None, np.empty(0, np.int64))
    stats = valid.select(
        mean=pl.col("guess").mean(), median=pl.col("guess").median(), std=pl.col("guess").std()
    ).row(0, named=True)
    target = rule.target(stats["mean"])
    distance = valid.with_columns(d=(pl.col("guess") - target).abs())
    nearest = distance["d"].min()
    # Guesses are decimals with at most two places: compare distances with a tolerance
    # far below that resolution so float noise cannot split a tie.
    band = max(nearest, rule.tolerance) + 1e-9
    won = distance.filter(pl.col("d") <= band)
    best = distance.filter(pl.col("d") <= nearest + 1e-9)["guess"].min()
    return RoundOutcome(
        n=n,
        n_valid=n_valid,
        mean=stats["mean"],
        median=stats["median"],
        std=stats["std"],
        target=target,
        winning_guess=best,
        winners=np.sort(won["agent_id"].to_numpy()),
    )


class Groups(BaseModel):
    """The paper's nested environments: the population split into groups that each play
    their own game (own mean, target and winners) beside the game of everyone."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    by: str | None = Field(None, description="A persona attribute: one group per value (e.g. education).")
    rooms: int | None = Field(None, ge=1, description="Split the population into this many random rooms of (near) equal size.")

    @model_validator(mode="after")
    def _one_way(self) -> "Groups":
        if (self.by is None) == (self.rooms is None):
            raise ValueError("set exactly one of `by` (an attribute) or `rooms` (a number of rooms)")
        return self

    def assign(self, personas: pl.DataFrame, seed: int) -> pl.Series:
        """The group of every persona (a String series named ``group``, in row order).

        Rooms are balanced: agents are ordered by a key drawn from (seed, agent id) and
        dealt round-robin, so room sizes differ by at most one and do not depend on sharding.
        """
        if self.by is not None:
            if self.by not in personas.columns:
                raise ValueError(f"groups.by: {self.by!r} is not a persona attribute")
            return personas[self.by].cast(pl.String).fill_null("(none)").alias("group")
        from core.seeds import agent_seeds

        ids = personas["agent_id"].to_numpy()
        rank = np.empty(len(ids), np.int64)
        rank[np.argsort(agent_seeds(seed, ids, "rooms"), kind="stable")] = np.arange(len(ids))
        width = len(str(self.rooms))
        labels = [f"room {i + 1:0{width}d}" for i in range(self.rooms)]
        return pl.Series("group", rank % self.rooms).replace_strict(list(range(self.rooms)), labels, return_dtype=pl.String)


def group_outcomes(guesses: pl.DataFrame, groups: pl.DataFrame, rule: GameRule) -> dict[str, RoundOutcome]:
    """The outcome of every group, each computed from its own members only.

    Args:
        guesses: columns ``agent_id``, ``guess``, ``valid`` (as for ``outcome``).
        groups: columns ``agent_id`` and ``group``.
        rule: the game rule (every group plays the same rule).

    Returns:
        Group name → its outcome, sorted by group name.
    """
    joined = guesses.join(groups.select("agent_id", "group"), on="agent_id", how="inner")
    parts = joined.partition_by("group", as_dict=True, maintain_order=True)
    return {name: outcome(part, rule) for (name,), part in sorted(parts.items())}


def _clamp(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def _fmt(x: float) -> str:
    return f"{x:g}"
