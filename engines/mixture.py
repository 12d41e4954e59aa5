"""A mixture of engines in one game: each agent is played by one model for the whole game.

The paper played 500 agents each of three models in one game. An arm's engine may be
``kind: mixture`` with components ``{engine: {...}, fraction: f}``; agents are assigned
to components by quota (largest remainder), in an order drawn from the run seed.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

import engines
from core.quotas import quota_counts
from core.seeds import agent_seeds


class MixtureComponent(BaseModel):
    """One engine of a mixture and the share of agents it plays."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: engines.spec_union() = Field(description="An engine, a mapping with `kind:` and its settings.")  # type: ignore[valid-type]
    fraction: float = Field(gt=0, le=1, description="The share of the population this engine plays.")


class MixtureSpec(BaseModel):
    """Several engines playing one game, each for a fraction of the agents.

    Example (YAML)::

        engines:
          - kind: mixture
            components:
              - {fraction: 0.5, engine: {kind: llamacpp}}
              - {fraction: 0.5, engine: {kind: openai, base_url: "http://127.0.0.1:8000/v1", model: gemma}}
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mixture"] = "mixture"
    components: tuple[MixtureComponent, ...] = Field(min_length=1, description="The engines and their population fractions (summing to 1).")

    @field_validator("components")
    @classmethod
    def _fractions_sum_to_one(cls, components: tuple[MixtureComponent, ...]) -> tuple[MixtureComponent, ...]:
        total = sum(c.fraction for c in components)
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"fractions sum to {total:g}, expected 1")
        return components

    @property
    def model_name(self) -> str:
        return "mixture"

    def prompting(self) -> engines.Prompting:
        """Each component's prompt format (see ``EngineSpec.prompting``)."""
        return engines.Prompting("mixture", components=tuple(c.engine.prompting() for c in self.components))

    def identity(self) -> dict[str, str]:
        """Every component's model (see ``EngineSpec.identity``)."""
        return {k: v for c in self.components for k, v in c.engine.identity().items()}

    def check_context(self, prompts: Any, reserve: int, mode: str) -> None:
        """Every component must fit the prompts (see ``EngineSpec.check_context``)."""
        for c in self.components:
            c.engine.check_context(prompts, reserve, mode)

    def check_server(self) -> None:
        """Every component's server (see ``EngineSpec.check_server``)."""
        for c in self.components:
            c.engine.check_server()

    @property
    def key(self) -> str:
        """A short stable hash of this spec (as ``EngineSpec.key``)."""
        return engines.spec_key(self)

    def counts(self, n: int) -> np.ndarray:
        """Agents per component: fraction × n, rounded by largest remainder (sums to n)."""
        return quota_counts([c.fraction for c in self.components], n)

    def assign(self, agent_ids: np.ndarray, seed: int) -> np.ndarray:
        """The component index of each agent: quota counts, agents in a seeded random order.

        Depends only on the seed and the population, so an agent keeps its model in
        every round and on every resume.
        """
        ids = np.asarray(agent_ids, dtype=np.int64)
        order = np.argsort(agent_seeds(seed, ids, "mixture"), kind="stable")
        component = np.empty(len(ids), np.int64)
        component[order] = np.repeat(np.arange(len(self.components)), self.counts(len(ids)))
        return component

    def actors(self, total: int) -> list[int]:
        """Actors per component: the arm's actors split by fraction, at least one each."""
        return [max(1, round(total * c.fraction)) for c in self.components]


def shard_index(component: np.ndarray, shard_size: int) -> np.ndarray:
    """Shard numbers for agents in population order: shards never mix components.

    Each component's agents are cut into shards of ``shard_size`` by their position
    within the component; numbering continues from one component to the next. With a
    single component this is ``position // shard_size``.
    """
    component = np.asarray(component, dtype=np.int64)
    shard = np.empty(len(component), np.int64)
    offset = 0
    for c in np.unique(component):
        where = np.flatnonzero(component == c)
        shard[where] = offset + np.arange(len(where)) // shard_size
        offset += math.ceil(len(where) / shard_size)
    return shard
