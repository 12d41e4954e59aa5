"""Population specs: one attribute per entry, validated by pydantic.

A spec file (``populations/*.yaml``) or an inline ``population.attributes`` mapping says
how personas are drawn: categorical shares, numeric distributions (with optional bands
for reporting), conditional share tables (one per parent value) and locale-aware names.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

POPULATIONS_DIR = Path(__file__).parent

#: Numeric distributions a spec may name.
DISTRIBUTIONS = ("histogram", "normal", "truncnormal", "uniform")

#: How far shares may be from summing to 1 (specs are written by hand, in decimals).
SHARE_TOLERANCE = 1e-6


class SpecError(ValueError):
    """A population spec problem, as one line: ``attribute.path: what is wrong``."""


def _check_shares(shares: dict[str, float] | list[float], what: str = "shares") -> None:
    values = list(shares.values()) if isinstance(shares, dict) else list(shares)
    if not values:
        raise ValueError("needs at least one category")
    negative = [v for v in values if v < 0]
    if negative:
        raise ValueError(f"share {negative[0]:g} is negative")
    total = sum(values)
    if not math.isclose(total, 1.0, abs_tol=SHARE_TOLERANCE):
        raise ValueError(f"{what} sum to {total:.6g}, expected 1.0")


def _share_table(shares: dict[str, float]) -> dict[str, float]:
    _check_shares(shares)
    return shares


def _fraction(value: Any) -> Any:
    # "1/6" is exact where 0.1667 is not: equal shares of six categories sum to 1
    if isinstance(value, str) and "/" in value:
        top, _, bottom = value.partition("/")
        try:
            return float(Fraction(int(top), int(bottom)))
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{value!r} is not a fraction") from None
    return value


#: A share: a number or an exact fraction string ("1/6").
Share = Annotated[float, BeforeValidator(_fraction)]

#: Category → share, summing to 1 (errors carry the table's path).
ShareTable = Annotated[dict[str, Share], AfterValidator(_share_table)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Categorical(_Strict):
    """A categorical attribute: each category with its share of the population.

    YAML: ``education: {High School: 0.5, Bachelor's Degree: 0.5}``.
    """

    kind: Literal["categorical"] = "categorical"
    shares: ShareTable = Field(description="Category → share; shares sum to 1.")

    @property
    def labels(self) -> list[str]:
        return list(self.shares)


class Conditional(_Strict):
    """A categorical attribute whose shares depend on another attribute's value.

    YAML: ``occupation: {given: education, shares: {High School: {Clerk: 0.6, ...}, ...}}``
    — one share table per value of the parent (``given``), which must be declared earlier.
    """

    kind: Literal["conditional"] = "conditional"
    given: str = Field(description="The parent attribute (categorical, conditional, or a numeric `<name>_band`).")
    shares: dict[str, ShareTable] = Field(description="Parent value → (category → share); each table sums to 1.")

    @property
    def labels(self) -> list[str]:
        """Every category of any table, in order of first appearance."""
        seen: dict[str, None] = {}
        for table in self.shares.values():
            seen.update(dict.fromkeys(table))
        return list(seen)


class Numeric(_Strict):
    """A numeric attribute stored as a number, with optional bands for reporting.

    Distributions: ``uniform`` (low, high), ``normal`` (mean, sd), ``truncnormal`` (mean,
    sd, low, high) and ``histogram`` (bin ``edges`` and one share per bin; uniform inside a
    bin). ``bands: [18, 25, 35]`` adds a ``<name>_band`` column ("<18", "18-24", "25-34", "35+").
    """

    kind: Literal["numeric"] = "numeric"
    distribution: str = Field(description=f"One of {', '.join(DISTRIBUTIONS)}.")
    low: float | None = Field(None, description="Lower bound (uniform, truncnormal).")
    high: float | None = Field(None, description="Upper bound (uniform, truncnormal).")
    mean: float | None = Field(None, description="Mean (normal, truncnormal).")
    sd: float | None = Field(None, gt=0, description="Standard deviation (normal, truncnormal).")
    edges: list[float] | None = Field(None, description="Bin edges, increasing (histogram).")
    shares: list[Share] | None = Field(None, description="One share per bin, summing to 1 (histogram).")
    integer: bool = Field(False, description="Store whole numbers (histograms floor, other distributions round).")
    bands: list[float] | None = Field(None, description="Band edges for reporting: adds a `<name>_band` column.")

    @field_validator("distribution")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {name!r}; available: {', '.join(DISTRIBUTIONS)}")
        return name

    @model_validator(mode="after")
    def _parameters(self) -> "Numeric":
        need = {
            "uniform": ("low", "high"),
            "normal": ("mean", "sd"),
            "truncnormal": ("mean", "sd", "low", "high"),
            "histogram": ("edges", "shares"),
        }[self.distribution]
        missing = [p for p in need if getattr(self, p) is None]
        if missing:
            raise ValueError(f"distribution {self.distribution!r} needs {', '.join(missing)}")
        if self.distribution in ("uniform", "truncnormal") and not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.distribution == "histogram":
            if len(self.edges) != len(self.shares) + 1:
                raise ValueError(f"a histogram needs one more edge than shares, got {len(self.edges)} edges and {len(self.shares)} shares")
            if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
                raise ValueError(f"edges must increase, got {self.edges}")
            _check_shares(self.shares, "histogram shares")
        if self.bands is not None and (not self.bands or any(b <= a for a, b in zip(self.bands, self.bands[1:]))):
            raise ValueError(f"bands must be increasing edges, got {self.bands}")
        return self

    @property
    def band_labels(self) -> list[str]:
        """Labels of the bands, lowest first: ``<a``, ``a-b``…, ``z+``."""
        if not self.bands:
            return []
        fmt = [f"{b:g}" for b in self.bands]
        upper = [f"{b - 1:g}" if self.integer else f"{b:g}" for b in self.bands]
        inner = [f"{fmt[i]}-{upper[i + 1]}" for i in range(len(fmt) - 1)]
        return [f"<{fmt[0]}", *inner, f"{fmt[-1]}+"]


class Names(_Strict):
    """Person names from a locale's name lists (Faker's), drawn with the spec's seed."""

    locale: str = Field("en_US", description="A Faker locale (en_US, de_DE, fr_FR, ja_JP…).")
    gender: str | None = Field(
        None, description="An attribute whose values say female/woman or male/man: names follow it."
    )


def _attribute_tag(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.kind
    if isinstance(value, dict):
        if "kind" in value:
            return str(value["kind"])
        if "distribution" in value:
            return "numeric"
        if "given" in value:
            return "conditional"
    return "categorical"


Attribute = Annotated[
    Union[
        Annotated[Categorical, Tag("categorical")],
        Annotated[Conditional, Tag("conditional")],
        Annotated[Numeric, Tag("numeric")],
    ],
    Discriminator(_attribute_tag),
]


class PopulationSpec(_Strict):
    """How to draw personas: attributes, names and the sampling mode."""

    name: str = Field("population", description="A label for this population.")
    source: str | None = Field(None, description="Where the shares come from (a paper, a census table).")
    sampling: Literal["quota", "iid"] = Field(
        "quota", description="quota: exact marginals by largest-remainder rounding (within each parent group for conditional attributes), then shuffled; iid: independent draws."
    )
    names: Names | None = Field(None, description="Add a `name` column drawn from a locale's name lists.")
    attributes: dict[str, Attribute] = Field(default_factory=dict, description="Attribute name → its distribution.")

    @field_validator("attributes", mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        # `education: {High School: 0.5, ...}` is shorthand for a categorical attribute
        if isinstance(value, dict):
            return {
                k: ({"kind": "categorical", "shares": v} if isinstance(v, dict) and not ({"kind", "shares", "distribution", "given"} & set(v)) else v)
                for k, v in value.items()
            }
        return value

    @model_validator(mode="after")
    def _references(self) -> "PopulationSpec":
        values: dict[str, list[str]] = {}  # attribute (or band column) → its categories
        for name, attribute in self.attributes.items():
            if name in ("agent_id", "name", "background", "experiment_id"):
                raise ValueError(f"attributes.{name}: reserved column name")
            if isinstance(attribute, Conditional):
                if attribute.given not in values:
                    hint = "must be declared before it" if attribute.given in self.attributes else "is not an attribute of this spec"
                    raise ValueError(f"attributes.{name}.given: {attribute.given!r} {hint}")
                known = values[attribute.given]
                for parent in attribute.shares:
                    if parent not in known:
                        raise ValueError(
                            f"attributes.{name}.shares.{parent}: unknown value of parent {attribute.given!r}; known: {', '.join(known)}"
                        )
                missing = [v for v in known if v not in attribute.shares]
                if missing:
                    raise ValueError(f"attributes.{name}.shares: no share table for {attribute.given} = {missing[0]!r}")
            if isinstance(attribute, Numeric):
                if attribute.bands:
                    values[f"{name}_band"] = attribute.band_labels
            else:
                values[name] = attribute.labels
        if self.names and self.names.gender and self.names.gender not in self.attributes:
            raise ValueError(f"names.gender: {self.names.gender!r} is not an attribute of this spec")
        return self


def format_spec_error(exc: ValidationError) -> str:
    """The first validation error as one line: ``attributes.education.shares: …``."""
    error = exc.errors(include_url=False)[0]
    # Drop the union tags pydantic puts in the path (categorical/numeric/conditional).
    loc = [str(p) for p in error["loc"] if p not in ("categorical", "conditional", "numeric")]
    message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    elif error["type"] not in ("value_error", "assertion_error") and not isinstance(error.get("input"), dict):
        message = f"{error.get('input')!r}: {message[0].lower()}{message[1:]}"
    path = ".".join(loc)
    return f"{path}: {message}" if path else message


def parse_spec(data: dict[str, Any], origin: str = "population", separator: str = ".") -> PopulationSpec:
    """Validate a spec mapping.

    Args:
        data: the spec as a mapping.
        origin: what to name the spec by in errors (a config field or a file name).
        separator: between origin and the path inside the spec ("." for a config field).

    Raises:
        SpecError: one line naming the attribute path and the bad value.
    """
    try:
        return PopulationSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{origin}{separator}{format_spec_error(exc)}") from None


def load_spec(path: str | Path) -> PopulationSpec:
    """Read a spec file; relative names are also looked up in ``populations/``.

    Raises:
        SpecError: the file is missing, is not YAML, or does not validate (one line).
    """
    file = Path(path)
    if not file.exists() and (POPULATIONS_DIR / file).exists():
        file = POPULATIONS_DIR / file
    if not file.exists():
        raise SpecError(f"{path}: no such population spec (looked here and in populations/)")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise SpecError(f"{path}: {where}invalid YAML ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping with `attributes`, got {type(data).__name__}")
    data.setdefault("name", file.stem)
    return parse_spec(data, origin=str(path), separator=": ")
