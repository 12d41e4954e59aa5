"""How the flow runs its stage tasks: run names, retries with backoff, caching.

Engine and I/O failures (a Ray actor or task error, a locked or unreachable file, a
timeout) are retried with exponential backoff; bad input is not. The personas stage is
cached by experiment id (config hash), size and warehouse, so a retried flow run skips
it (its cached result is a small receipt: the personas themselves are in the warehouse);
rounds need no Prefect cache: a finished round is committed in the warehouse and skipped
by the flow, and a half-played round replays only its missing shards.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

import duckdb
import ray.exceptions
from prefect import task
from prefect.cache_policies import NONE, CacheKeyFnPolicy
from prefect.tasks import exponential_backoff

from tasks.environment import group_outcomes, outcome
from tasks.personas import personas_stage
from tasks.play import play_round
from tasks.store import load_round, store_outcome
from warehouse.store import Warehouse, WarehouseError

#: Errors worth another try: the engine (inside a Ray actor) or the machine, not the input.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ray.exceptions.RayError,
    OSError,  # includes ConnectionError and TimeoutError
    WarehouseError,
    duckdb.IOException,
)

#: 2 s, 4 s, 8 s… between tries, each ±50 % so that many runs do not retry in step.
BACKOFF = exponential_backoff(backoff_factor=2)
JITTER = 0.5


def is_transient(error: BaseException | None) -> bool:
    """Whether an error comes from an engine or I/O (retry) rather than from the input (don't)."""
    return isinstance(error, TRANSIENT_ERRORS)


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only engine and I/O errors."""
    error = state.data if isinstance(state.data, BaseException) else None
    return is_transient(error)


def personas_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """The personas stage's cache key: experiment id (the config hash), size and warehouse.

    The warehouse enters as its resolved path and the experiment's ``created_at``, so a
    deleted or replaced file never hits an old cache entry (its personas would be missing).
    """
    warehouse: Warehouse = parameters["warehouse"]
    experiment_id = parameters["experiment_id"]
    try:
        created = warehouse.query("SELECT created_at FROM experiments WHERE experiment_id = ?", [experiment_id])
    except (WarehouseError, duckdb.Error):
        return None
    if created.height == 0:
        return None  # not recorded yet: nothing to tie a cache entry to
    identity = f"{warehouse.path.resolve()}|{created.item(0, 0).isoformat()}"
    return f"personas-{experiment_id}-{parameters['size']}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


_RETRY = {"retry_delay_seconds": BACKOFF, "retry_jitter_factor": JITTER, "retry_condition_fn": retry_transient}

personas = personas_stage.with_options(
    retries=2,
    cache_policy=CacheKeyFnPolicy(cache_key_fn=personas_cache_key),
    cache_expiration=datetime.timedelta(days=7),
    persist_result=True,
    task_run_name="personas-{experiment_id}-n{size}",
    **_RETRY,
)
play = play_round.with_options(retries=3, **_RETRY)  # named play-<run>-round-<r> by its decorator
load = load_round.with_options(retries=3, **_RETRY)
store = store_outcome.with_options(retries=3, **_RETRY)


environment_stage = task(name="environment", cache_policy=NONE)(outcome)  # pure and quick: no retries


def environment(run_id: str, round_: int):
    """The environment stage of one round of one arm, named after them."""
    return environment_stage.with_options(task_run_name=f"environment-{run_id}-round-{round_}")


groups_stage = task(name="environment-groups", cache_policy=NONE)(group_outcomes)


def groups(run_id: str, round_: int):
    """The per-group environment stage of one round of one arm (nested environments)."""
    return groups_stage.with_options(task_run_name=f"environment-groups-{run_id}-round-{round_}")
