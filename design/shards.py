"""How many agents a shard holds: the user's ``workers.shard_size``, else keynes's own size.

A shard is the unit of work an actor plays and the driver commits. Every shard costs about the
same whatever its size (a Ray task, a pandera check and a DuckDB transaction: tens of
milliseconds), so 4,000 shards of 5 agents spend minutes where 8 of 2,500 spend a fraction of a
second. keynes sizes shards so that each actor gets a few of them (progress bars move, work
spreads, rounds commit as they go), each holding a whole number of batches of what the engine serves
together, and at most ``MAX_SHARD`` agents. Reading it imports no orchestration.
"""

from __future__ import annotations

import math
from typing import Iterable

from engines import EngineSpec
from engines.mixture import MixtureSpec

#: Shards each actor plays in a round when keynes sizes them: enough that progress moves and a
#: slow shard does not leave the other actors idle for long; few enough that their fixed cost
#: (``keynes plan`` measures it) stays a small part of the round.
SHARDS_PER_ACTOR = 4
#: The most agents in a shard keynes makes (its rows travel to and from an actor at once).
MAX_SHARD = 50_000


def engine_batch(engines: Iterable[EngineSpec | MixtureSpec]) -> int:
    """The smallest batch of requests any of these engines serves together (``EngineSpec.batch``;
    a mixture's, its components')."""
    batches = []
    for spec in engines:
        parts = [c.engine for c in spec.components] if isinstance(spec, MixtureSpec) else [spec]
        batches += [p.batch for p in parts]
    return max(1, min(batches, default=1))


def auto_shard_size(agents: int, actors: int, batch: int = 1) -> int:
    """keynes's shard size for ``agents`` on ``actors`` actors of an engine that serves ``batch``
    requests together.

    ``SHARDS_PER_ACTOR`` shards per actor, rounded up to a whole number of batches (at least one
    batch unless that would leave an actor without a shard); at most ``MAX_SHARD``.

    >>> auto_shard_size(30, 2), auto_shard_size(20_000, 2), auto_shard_size(1_000_000, 4)
    (4, 2500, 50000)
    """
    agents, actors, batch = max(1, agents), max(1, actors), max(1, batch)
    size = math.ceil(agents / (actors * SHARDS_PER_ACTOR))
    size = min(batch, math.ceil(agents / actors)) if size < batch else math.ceil(size / batch) * batch
    return max(1, min(size, MAX_SHARD))


def shard_size(cfg, recorded: int | None = None) -> int:
    """The shard size a run of ``cfg`` (an ``ExperimentConfig``) plays with.

    ``workers.shard_size`` when the user set one; else ``recorded``, the size the experiment was
    first run with (``tasks.store.recorded_shard_size``), so that a resumed round keeps the shard
    boundaries it started with even if ``workers.actors`` changed; else ``auto_shard_size`` of the
    population, the actors and the engines.
    """
    if cfg.workers.shard_size is not None:
        return cfg.workers.shard_size
    if recorded:
        return recorded
    return auto_shard_size(cfg.population.size, cfg.workers.actors, engine_batch(cfg.arms.engines))


def sized(cfg, recorded: int | None = None):
    """``cfg`` with ``workers.shard_size`` set to the size its run plays with (``shard_size``):
    what the play stage cuts shards by and what ``begin_experiment`` records with the config.
    The experiment id does not change (where agents play is not part of it)."""
    size = shard_size(cfg, recorded)
    if size == cfg.workers.shard_size:
        return cfg
    return cfg.model_copy(update={"workers": cfg.workers.model_copy(update={"shard_size": size})})


def pool_size(agents: int, actors: int, shard_size: int) -> int:
    """A plain engine's actors for a population: ``actors``, but no more than it has shards (at least one)."""
    return max(1, min(actors, -(-agents // shard_size)))
