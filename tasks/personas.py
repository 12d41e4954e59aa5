"""Stage 1, personas: sample the population once per experiment and store it.

A rerun of the same experiment reads the stored personas instead of sampling again.
"""

from __future__ import annotations

import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from populations.sampler import sample
from populations.spec import PopulationSpec
from warehouse.store import Warehouse


@task(name="personas", cache_policy=NONE, retries=2, retry_delay_seconds=[1, 5])
def personas_stage(experiment_id: str, spec: PopulationSpec, size: int, seed: int, warehouse: Warehouse) -> pl.DataFrame:
    """The experiment's personas: stored ones if present, else sampled and stored."""
    stored = warehouse.read_personas(experiment_id)
    if stored.height == size:
        return stored
    personas = sample(spec, size, seed)
    warehouse.write_personas(experiment_id, personas)
    return warehouse.read_personas(experiment_id)
