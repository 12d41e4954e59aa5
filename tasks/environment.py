"""Stage 3, environment: a round's outcome from its guesses (and each group's, when nested).

The arithmetic lives in ``core.game`` (plain Python); these tasks name the stage in the
Prefect UI. Pure and quick: no retries, no cache.
"""

from __future__ import annotations

import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from core.game import GameRule, RoundOutcome, group_outcomes, outcome


@task(name="environment", cache_policy=NONE, task_run_name="environment-{run_id}-round-{round_}")
def environment(run_id: str, round_: int, guesses: pl.DataFrame, rule: GameRule) -> RoundOutcome:
    """The outcome of one round of one arm: statistics, target, winners."""
    return outcome(guesses, rule)


@task(name="environment-groups", cache_policy=NONE, task_run_name="environment-groups-{run_id}-round-{round_}")
def group_environments(
    run_id: str, round_: int, guesses: pl.DataFrame, groups: pl.DataFrame, rule: GameRule
) -> dict[str, RoundOutcome]:
    """The outcome of every group of one round of one arm (nested environments)."""
    return group_outcomes(guesses, groups, rule)
