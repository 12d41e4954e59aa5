"""Stage 1, personas: sample the population once per experiment, add backstories, store it.

Backstories are written by an LLM through the engine layer, in batches on Ray workers,
and cached in the warehouse by (persona attributes, template hash, model, seed,
sampling): a rerun, or another experiment over the same population, reuses them.
A rerun of the same experiment reads the stored personas instead of sampling again.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from prefect import task
from prefect.cache_policies import CacheKeyFnPolicy

from core.personas import attribute_columns
from core.seeds import agent_seeds
from engines import CompletionBatch, EngineSpec, RequestBatch, Sampling
from populations.backstories import BackstoryConfig, attributes_json, cache_keys, clean_backstory, template_hash
from populations.sampler import sample
from populations.spec import PopulationSpec
from prompts.render import render
from tasks import progress, store
from tasks.retries import ON_TRANSIENT_ERRORS
from tasks.store import Warehouse

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class BackstoryCounts:
    """What attaching backstories did: written now, read from the cache, failed (left null)."""

    generated: int
    reused: int
    failed: int


@dataclass(frozen=True)
class PersonasStored:
    """The personas stage's receipt: the experiment, its agent count, whether they were sampled
    now (False: already stored) and, when backstories were attached, their counts."""

    experiment_id: str
    agents: int
    sampled: bool
    backstories: BackstoryCounts | None = None


def personas_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """The stage's cache key: experiment id (the config hash), size and warehouse.

    The warehouse enters as its resolved path and the experiment's ``created_at``, so a
    deleted or replaced file never hits an old cache entry (its personas would be missing).
    """
    experiment_id = parameters["experiment_id"]
    identity = store.personas_identity(parameters["warehouse"], experiment_id)
    if identity is None:
        return None  # not recorded yet: nothing to tie a cache entry to
    return f"personas-{experiment_id}-{parameters['size']}-{hashlib.sha256(identity.encode()).hexdigest()[:12]}"


# Cached by experiment, so a retried flow run skips it; its cached result is a small receipt
# (the personas themselves are in the warehouse).
@task(
    name="personas",
    retries=2,
    cache_policy=CacheKeyFnPolicy(cache_key_fn=personas_cache_key),
    cache_expiration=datetime.timedelta(days=7),
    persist_result=True,
    task_run_name="personas-{experiment_id}-n{size}",
    **ON_TRANSIENT_ERRORS,
)
def personas_stage(
    experiment_id: str,
    spec: PopulationSpec,
    size: int,
    seed: int,
    warehouse: Warehouse,
    backstories: BackstoryConfig | None = None,
    actors: int = 1,
    ray_address: str | None = None,
    dashboard: bool = False,
) -> PersonasStored:
    """Store the experiment's personas unless they are stored already: sampled, with
    backstories when enabled. Returns what was done (``PersonasStored``);
    the personas themselves are read from the warehouse, which is why this stage's
    cached result stays a few bytes at any population size.
    """
    if store.stored_personas(warehouse, experiment_id) == size:
        return PersonasStored(experiment_id, size, sampled=False)
    personas, counts = make_personas(spec, size, seed, warehouse, backstories, actors, ray_address, dashboard)
    if counts is not None:
        log.info("backstories: %d generated, %d reused, %d failed", counts.generated, counts.reused, counts.failed)
    store.store_personas(warehouse, experiment_id, personas)
    return PersonasStored(experiment_id, size, sampled=True, backstories=counts)


def experiment_personas(experiment_id: str, spec: PopulationSpec, size: int, seed: int, warehouse: Warehouse, **options: Any) -> pl.DataFrame:
    """Stage 1 for the flow: the experiment's personas, stored by the (cached) stage and read back.

    ``options``: the stage's own (backstories, actors, ray_address, dashboard). A cached stage
    whose rows are gone from the file (a replaced warehouse) runs again.
    """
    personas_stage(experiment_id, spec, size, seed, warehouse, **options)
    personas = store.read_personas(warehouse, experiment_id)
    if personas.height != size:
        personas_stage.with_options(refresh_cache=True)(experiment_id, spec, size, seed, warehouse, **options)
        personas = store.read_personas(warehouse, experiment_id)
    return personas


def make_personas(
    spec: PopulationSpec,
    size: int,
    seed: int,
    warehouse: Warehouse,
    backstories: BackstoryConfig | None = None,
    actors: int = 1,
    ray_address: str | None = None,
    dashboard: bool = False,
) -> tuple[pl.DataFrame, BackstoryCounts | None]:
    """Sample personas and, when enabled, attach backstories (not stored yet).

    Returns:
        The personas, and the backstory counts (None without backstories).
    """
    personas = sample(spec, size, seed)
    if backstories is None or not backstories.enabled:
        return personas, None
    return attach_backstories(personas, backstories, seed, warehouse, actors, ray_address, dashboard)


def population_id(spec: PopulationSpec, size: int, seed: int, backstories: BackstoryConfig | None = None) -> str:
    """The id a stand-alone population is stored under in ``personas.experiment_id``:
    the same spec, size, seed (and backstory settings) → the same id."""
    parts = [spec.model_dump_json(), str(size), str(seed)]
    if backstories is not None and backstories.enabled:
        parts.append(backstories.model_dump_json())
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:8]
    return f"population-{spec.name}-n{size}-s{seed}-{digest}"


def backstory_requests(personas: pl.DataFrame, settings: BackstoryConfig, seed: int, model: str) -> pl.DataFrame:
    """One row per persona: agent_id, key, attributes (JSON), seed, prompt."""
    source = settings.template_path()
    ids = personas["agent_id"].to_numpy().astype(np.int64)
    seeds = (agent_seeds(seed, ids, "backstory") & np.uint64(0x7FFFFFFF)).astype(np.int64)
    attributes = attributes_json(personas)
    columns = attribute_columns(personas.columns)
    frame = personas.select(pl.struct(columns).alias("persona")) if columns else pl.DataFrame({"_": [None] * personas.height})
    prompts = render(str(source), {}, frame)
    keys = cache_keys(attributes, template_hash(source.read_text()), model, seeds, settings.temperature, settings.max_tokens)
    return pl.DataFrame({"agent_id": ids, "key": keys, "attributes": attributes, "seed": seeds, "prompt": prompts})


def attach_backstories(
    personas: pl.DataFrame,
    settings: BackstoryConfig,
    seed: int,
    warehouse: Warehouse,
    actors: int = 1,
    ray_address: str | None = None,
    dashboard: bool = False,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """Add a ``background`` column: cached backstories, the missing ones generated.

    Missing backstories are generated in batches of ``settings.batch_size`` on a pool of
    Ray actors that own the engine; each batch is committed to the cache as it arrives,
    so an interrupted run keeps what it wrote. A persona whose generation failed keeps
    a null background (and is retried next time).

    Returns:
        The personas with ``background``, and what was generated, reused and failed.
    """
    spec = settings.engine_spec()
    requests = backstory_requests(personas, settings, seed, spec.model_name)
    cached = store.cached_backstories(warehouse, requests["key"])
    missing = requests.join(cached.select("key"), on="key", how="anti", maintain_order="left").unique("key", maintain_order=True)
    generated = failed = 0
    if missing.height:
        generated, failed = _generate(missing, settings, spec, warehouse, actors, ray_address, dashboard)
        cached = store.cached_backstories(warehouse, requests["key"])
    reused = requests.height - missing.height
    joined = requests.select("agent_id", "key").join(cached, on="key", how="left", maintain_order="left")
    out = personas.drop("background", strict=False).with_columns(background=joined["background"])
    return out, BackstoryCounts(generated, reused, failed)


def _generate(
    missing: pl.DataFrame,
    settings: BackstoryConfig,
    spec: EngineSpec,
    warehouse: Warehouse,
    actors: int,
    ray_address: str | None,
    dashboard: bool,
) -> tuple[int, int]:
    """Generate the missing backstories on Ray workers; return (written, failed)."""
    from tasks.pool import WorkerPool, ensure_ray  # Ray only when something is generated

    ensure_ray(ray_address, dashboard)
    sampling = Sampling(settings.temperature, settings.max_tokens)
    parts = [missing.slice(i, settings.batch_size) for i in range(0, missing.height, settings.batch_size)]
    batches = [RequestBatch(p["agent_id"].to_numpy(), p["prompt"].to_list(), p["seed"].to_numpy(), sampling, None) for p in parts]
    by_batch = {id(b): p for b, p in zip(batches, parts)}
    written = failed = 0
    bar = progress.current().start("backstories", total=missing.height)
    template = template_hash(settings.template_path().read_text())

    def commit(finished: list[tuple[RequestBatch, CompletionBatch]]) -> None:
        nonlocal written, failed
        parts = []
        for batch, result in finished:
            parts.append(by_batch[id(batch)].with_columns(
                raw=pl.Series(result.text, dtype=pl.String),
                error=pl.Series(result.error, dtype=pl.String),
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                latency_s=result.latency_s,
            ))
        rows = pl.concat(parts, how="vertical_relaxed")
        ok = rows.filter(pl.col("error").is_null() & pl.col("raw").is_not_null())
        failed += rows.height - ok.height
        if ok.height:
            ok = ok.with_columns(
                background=pl.Series([clean_backstory(p, t) for p, t in zip(ok["prompt"], ok["raw"])], dtype=pl.String),
                template_hash=pl.lit(template),
                engine=pl.lit(spec.kind),
                model=pl.lit(spec.model_name),
                temperature=pl.lit(settings.temperature),
                max_tokens=pl.lit(settings.max_tokens),
            )
            written += store.store_backstories(warehouse, ok)
        bar.advance(rows.height)

    pool = WorkerPool(spec, actors)
    try:
        pool.run(batches, commit, method="complete")
    finally:
        pool.shutdown()
        bar.finish()
    return written, failed
