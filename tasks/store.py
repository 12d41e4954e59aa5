"""Stage 4, store: read a round's committed guesses and commit its outcome.

Guesses are committed shard by shard during play (``Warehouse.write_shard``); this
stage commits the round's outcome and winners in one transaction, exactly once.
"""

from __future__ import annotations

import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from tasks.environment import RoundOutcome
from warehouse.store import Warehouse


@task(name="load-round", cache_policy=NONE, retries=2, retry_delay_seconds=[1, 5], task_run_name="load-{run_id}-round-{round_}")
def load_round(warehouse: Warehouse, run_id: str, round_: int, expected: int) -> pl.DataFrame:
    """The round's guesses; fails (and is retried) if any agent is missing."""
    guesses = warehouse.round_guesses(run_id, round_)
    if guesses.height != expected:
        raise RuntimeError(f"{run_id} round {round_}: {guesses.height} guesses stored, expected {expected}")
    return guesses


@task(name="store", cache_policy=NONE, retries=2, retry_delay_seconds=[1, 5], task_run_name="store-{run_id}-round-{round_}")
def store_outcome(
    warehouse: Warehouse, run_id: str, round_: int, outcome: RoundOutcome, seconds: float,
    groups: dict[str, RoundOutcome] | None = None,
) -> bool:
    """Commit the round's outcome and winners, and each group's (once); True if this call wrote them."""
    return warehouse.write_outcome(run_id, round_, outcome, seconds, groups)
