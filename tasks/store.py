"""Stage 4, store: every commit of a round — its shards as they finish, then its outcome.

Play hands each batch of finished shards to ``commit_shards`` (one transaction, keyed so
a re-played shard writes nothing twice); once every agent's guess is stored the round's
outcome and winners are committed in one transaction, exactly once.
"""

from __future__ import annotations

import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from core.game import RoundOutcome
from tasks.actor import ShardJob, ShardResult
from tasks.retries import ON_TRANSIENT_ERRORS
from warehouse.store import Warehouse


def commit_shards(warehouse: Warehouse, finished: list[tuple[ShardJob, ShardResult]]) -> int:
    """Commit finished shards of one round (guesses and ``shards`` rows) in one transaction.

    Returns:
        The number of guesses written (rows already stored are skipped).
    """
    return warehouse.write_shards([
        (result.guesses,
         {"run_id": job.arm.run_id, "round": job.round, "shard": job.shard, "n": job.agents.height,
          "node": result.node, "worker": result.worker, "seconds": result.seconds,
          "limit_wait_s": result.limit_wait_s, "distributions": result.distributions})
        for job, result in finished
    ])


@task(name="load-round", cache_policy=NONE, retries=3, task_run_name="load-{run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def load_round(warehouse: Warehouse, run_id: str, round_: int, expected: int) -> pl.DataFrame:
    """The round's guesses (retried on I/O errors); fails if any agent's guess is missing,
    which no retry of this task can mend (the round is re-played by the next run)."""
    guesses = warehouse.round_guesses(run_id, round_)
    if guesses.height != expected:
        raise RuntimeError(f"{run_id} round {round_}: {guesses.height} guesses stored, expected {expected}")
    return guesses


@task(name="store", cache_policy=NONE, retries=3, task_run_name="store-{run_id}-round-{round_}", **ON_TRANSIENT_ERRORS)
def store_outcome(
    warehouse: Warehouse, run_id: str, round_: int, outcome: RoundOutcome, seconds: float,
    groups: dict[str, RoundOutcome] | None = None,
) -> bool:
    """Commit the round's outcome and winners, and each group's (once); True if this call wrote them."""
    return warehouse.write_outcome(run_id, round_, outcome, seconds, groups)
