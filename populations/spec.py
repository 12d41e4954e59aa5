"""Population specs: one attribute per entry, validated by pydantic.

A spec file (``populations/*.yaml``) or an inline ``population.attributes`` mapping
describes how personas are drawn. The spine supports categorical attributes with
shares; see the README for the full format.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

POPULATIONS_DIR = Path(__file__).parent


class Categorical(BaseModel):
    """A categorical attribute: each category with its share of the population."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["categorical"] = "categorical"
    shares: dict[str, float] = Field(description="Category → share; shares sum to 1.")

    @field_validator("shares")
    @classmethod
    def _sum_to_one(cls, shares: dict[str, float]) -> dict[str, float]:
        if not shares:
            raise ValueError("needs at least one category")
        if any(s < 0 for s in shares.values()):
            raise ValueError("shares cannot be negative")
        total = sum(shares.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"shares sum to {total:g}, expected 1.0")
        return shares


class PopulationSpec(BaseModel):
    """How to draw personas: attributes and the sampling mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("population", description="A label for this population.")
    sampling: Literal["quota", "iid"] = Field(
        "quota", description="quota: exact marginals by largest-remainder rounding, then shuffled; iid: independent draws."
    )
    attributes: dict[str, Categorical] = Field(default_factory=dict, description="Attribute name → its distribution.")

    @field_validator("attributes", mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        # `education: {High School: 0.5, ...}` is shorthand for a categorical attribute
        if isinstance(value, dict):
            return {
                k: ({"kind": "categorical", "shares": v} if isinstance(v, dict) and "kind" not in v and "shares" not in v else v)
                for k, v in value.items()
            }
        return value


def load_spec(path: str | Path) -> PopulationSpec:
    """Read a spec file; relative names are also looked up in ``populations/``."""
    file = Path(path)
    if not file.exists() and (POPULATIONS_DIR / file).exists():
        file = POPULATIONS_DIR / file
    if not file.exists():
        raise FileNotFoundError(f"population spec {str(path)!r} not found")
    data = yaml.safe_load(file.read_text()) or {}
    data.setdefault("name", file.stem)
    return PopulationSpec.model_validate(data)
