"""pandera schemas: every table is checked at the boundary, before it is written.

A failed check raises ``pandera.errors.SchemaErrors`` naming the column, the check and
the failing values; nothing is written then.
"""

from __future__ import annotations

from typing import Optional

import pandera.polars as pa
import polars as pl


class GuessRows(pa.DataFrameModel):
    """One row per agent per round: every guess, valid or not."""

    run_id: str
    round: int = pa.Field(ge=1)
    agent_id: int = pa.Field(ge=0)
    shard: int = pa.Field(ge=0)
    engine: str
    model: str
    guess: float = pa.Field(nullable=True)
    valid: bool
    raw: str = pa.Field(nullable=True)
    reasoning: str = pa.Field(nullable=True)
    prompt_tokens: int = pa.Field(ge=0)
    completion_tokens: int = pa.Field(ge=0)
    latency_s: float = pa.Field(ge=0)
    attempts: int = pa.Field(ge=0)
    error: str = pa.Field(nullable=True)
    shared_prompt: bool
    context: str = pa.Field(nullable=True)

    class Config:
        strict = True
        coerce = True

    @pa.dataframe_check(error="a valid guess needs a number and an invalid one none")
    def valid_iff_guess(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("valid") == pl.col("guess").is_not_null())

    @pa.dataframe_check(error="an invalid guess must say why (error)")
    def invalid_has_error(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("valid") | pl.col("error").is_not_null())


class PersonaRows(pa.DataFrameModel):
    """One row per agent of an experiment.

    Demographic columns vary by population spec (one per attribute, ``<name>_band`` for
    banded numbers, ``name``); every one of them must be filled for every agent, so SQL
    and reports can group by them. ``background`` is the optional LLM-written backstory.
    """

    experiment_id: str
    agent_id: int = pa.Field(ge=0, unique=True)
    background: str = pa.Field(nullable=True)
    name: Optional[str] = pa.Field(str_length={"min_value": 1})

    class Config:
        strict = False
        coerce = True

    @pa.dataframe_check(error="every demographic column is filled for every agent")
    def demographics_filled(cls, data: pa.PolarsData) -> pl.LazyFrame:
        columns = [c for c in data.lazyframe.collect_schema().names() if c not in ("experiment_id", "agent_id", "background")]
        if not columns:
            return data.lazyframe.select(pl.lit(True))
        return data.lazyframe.select(pl.all_horizontal(pl.col(columns).is_not_null()))


class BackstoryRows(pa.DataFrameModel):
    """One cached backstory per (persona attributes, template, model, seed, sampling)."""

    key: str = pa.Field(unique=True, str_length={"min_value": 64, "max_value": 64})
    attributes: str
    template_hash: str
    engine: str
    model: str
    seed: int = pa.Field(ge=0)
    temperature: float = pa.Field(ge=0)
    max_tokens: int = pa.Field(gt=0)
    prompt: str
    raw: str
    background: str
    prompt_tokens: int = pa.Field(ge=0)
    completion_tokens: int = pa.Field(ge=0)
    latency_s: float = pa.Field(ge=0)

    class Config:
        strict = True
        coerce = True
