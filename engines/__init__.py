"""Inference engines behind one small protocol, chosen by ``kind:`` in config.

An engine turns a batch of prompts into a batch of completions. Batches are
columnar (arrays and lists, one entry per agent) so that a million agents cost
a few array operations, not a million Python objects; engines that work one
request at a time iterate over ``RequestBatch`` and build the result with
``CompletionBatch.from_rows``.

Each engine module registers its config model and its builder at import time
(``register``); heavy libraries (llama.cpp, vLLM) are imported only when an
engine is built, so reading a config never needs them.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from core.game import GameRule


# --------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Constraint:
    """The answer an engine must produce: a number in [low, high].

    Engines that can constrain decoding (grammars, structured outputs) do so;
    every answer is validated after generation all the same.
    """

    low: float
    high: float
    integer: bool = True

    @property
    def regex(self) -> str:
        """A regular expression matching exactly the allowed answers (integers only
        when ``integer``; otherwise up to two decimals)."""
        from prompts.answers import number_regex

        return number_regex(self.low, self.high, self.integer)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters shared by every request of a batch."""

    temperature: float = 0.7
    max_tokens: int = 8
    top_p: float = 1.0


@dataclass(frozen=True)
class Request:
    """One agent's request: the row view of a ``RequestBatch``."""

    agent_id: int
    prompt: str
    seed: int
    sampling: Sampling
    constraint: Constraint | None


@dataclass
class RequestBatch:
    """A batch of requests, one entry per agent.

    Args:
        agent_id: agent ids (int64).
        prompt: the rendered prompt of each agent.
        seed: a per-agent sampling seed derived from the run seed (uint32 range).
        sampling: sampling parameters for the whole batch.
        constraint: the answer constraint, or None for free text (reasoning phase).
        rule: the game being played; LLM engines ignore it (the prompt says it all),
            the simulated engine's behavioural rules need it to best-respond.
    """

    agent_id: np.ndarray
    prompt: Sequence[str]
    seed: np.ndarray
    sampling: Sampling = field(default_factory=Sampling)
    constraint: Constraint | None = None
    rule: "GameRule | None" = None

    def __len__(self) -> int:
        return len(self.agent_id)

    def __iter__(self) -> Iterator[Request]:
        for agent_id, prompt, seed in zip(self.agent_id.tolist(), self.prompt, self.seed.tolist()):
            yield Request(agent_id, prompt, seed, self.sampling, self.constraint)


@dataclass(frozen=True)
class Completion:
    """One completion: the row view of a ``CompletionBatch``."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    attempts: int = 1
    error: str | None = None


@dataclass
class CompletionBatch:
    """Completions in request order, one entry per agent (``text``: a list, or a polars
    String Series from engines that make their answers column-wise)."""

    text: Sequence[str]
    prompt_tokens: np.ndarray
    completion_tokens: np.ndarray
    latency_s: np.ndarray
    attempts: np.ndarray
    error: list[str | None]

    def __len__(self) -> int:
        return len(self.text)

    @classmethod
    def from_rows(cls, rows: Sequence[Completion]) -> "CompletionBatch":
        return cls(
            text=[r.text for r in rows],
            prompt_tokens=np.fromiter((r.prompt_tokens for r in rows), np.int64, len(rows)),
            completion_tokens=np.fromiter((r.completion_tokens for r in rows), np.int64, len(rows)),
            latency_s=np.fromiter((r.latency_s for r in rows), np.float64, len(rows)),
            attempts=np.fromiter((r.attempts for r in rows), np.int64, len(rows)),
            error=[r.error for r in rows],
        )


# --------------------------------------------------------------------------- protocol
@runtime_checkable
class Engine(Protocol):
    """What every engine does. ``kind`` and ``model`` label every stored guess."""

    kind: str
    model: str

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete every request of the batch, in order. Never raises for one
        bad request: its completion carries ``error`` instead."""
        ...

    def close(self) -> None:
        """Release the model and any server connections."""
        ...


class EngineSpec(BaseModel):
    """Base of every engine's config model. Subclasses set ``kind`` as a Literal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="Which engine: llamacpp, openai, simulated or vllm.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for each Ray actor that owns this engine.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for each Ray actor that owns this engine.")

    @property
    def model_name(self) -> str:
        """The model label stored with every guess."""
        raise NotImplementedError

    @property
    def key(self) -> str:
        """A short stable hash of this spec: one actor pool per distinct engine."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class _Registered:
    spec: type[EngineSpec]
    build: Callable[[Any], Engine]


_REGISTRY: dict[str, _Registered] = {}
_MODULES = ("llamacpp", "openai", "simulated", "vllm")


def register(kind: str, spec: type[EngineSpec], build: Callable[[Any], Engine]) -> None:
    """Register an engine: its config model and a builder taking that config."""
    _REGISTRY[kind] = _Registered(spec, build)


def _load_all() -> None:
    """Import every engine module (each registers itself); none imports its heavy library."""
    for name in _MODULES:
        importlib.import_module(f"engines.{name}")


def available() -> list[str]:
    """The registered engine kinds, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def spec_class(kind: str) -> type[EngineSpec]:
    """The config model of an engine kind; unknown kinds list the available ones."""
    _load_all()
    if kind not in _REGISTRY:
        raise ValueError(f"unknown engine {kind!r}; available: {', '.join(available())}")
    return _REGISTRY[kind].spec


def parse_spec(value: Any) -> EngineSpec:
    """Validate a mapping (or an existing spec) as the engine config its ``kind`` names."""
    if isinstance(value, EngineSpec):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"an engine must be a mapping with a 'kind', got {value!r}")
    if "kind" not in value:
        raise ValueError(f"an engine needs a 'kind'; available: {', '.join(available())}")
    return spec_class(value["kind"]).model_validate(value)


def build_engine(spec: EngineSpec) -> Engine:
    """Build the engine a spec describes (imports its library on first use)."""
    if spec.kind not in _REGISTRY:  # a spec's own module registers it: others are not imported
        _load_all()
    return _REGISTRY[spec.kind].build(spec)
