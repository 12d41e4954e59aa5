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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterator, Protocol, Sequence, Union, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from core.game import GameRule
    from engines.shared_context.board import Board


# --------------------------------------------------------------------------- prompt format
@dataclass(frozen=True)
class Prompting:
    """How an engine formats prompts, resolved before a run starts (``EngineSpec.prompting``) and
    stored with it (``runs.prompting``, as ``as_json``).

    ``format``: ``completion``, ``chat``, or ``auto`` (a hub model's tokenizer decides when it
    loads); ``chat_template_sha256``: the digest of the chat template used (chat only);
    ``components``: a mixture's, one per component (its own format is then ``mixture``).
    """

    format: str
    chat_template_sha256: str | None = None
    components: tuple[Prompting, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The ``runs.prompting`` value."""
        if self.components:
            return {"components": [c.as_json() for c in self.components]}
        return {"format": self.format, "chat_template_sha256": self.chat_template_sha256}


@dataclass(frozen=True)
class ServerPrompting(Prompting):
    """An HTTP engine's prompt format: a chat template is the server's, not visible to keynes."""

    def as_json(self) -> dict[str, Any]:
        return {**super().as_json(), "chat_template": "server" if self.format == "chat" else None}


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
        when ``integer``; otherwise up to two decimals), after one optional space: the
        language of llama.cpp's grammar (``number_gbnf``), the same on every engine, so
        that a prompt ending in a colon continues with its most natural token."""
        from prompts.answers import number_regex

        return " ?" + number_regex(self.low, self.high, self.integer)


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters shared by every request of a batch, the same on every engine.

    The knobs besides ``temperature`` and ``max_tokens`` come from the arm
    (``arms.sampling``, ``SamplingSettings``); their defaults are llama.cpp's, which keep a
    small base model from looping. ``engines.shared_context.Chain`` documents the order in
    which they apply.
    """

    temperature: float = 0.7
    max_tokens: int = 8
    top_p: float = 1.0
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1

    def chain(self) -> dict[str, float | int]:
        """The filters and temperature by the names llama.cpp and vLLM share (their repetition
        penalties are named differently and passed by each engine)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}


class SamplingSettings(BaseModel):
    """``arms.sampling``: the sampling chain of every arm, on every engine (temperature: ``arms.temperatures``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top_p: float = Field(Sampling.top_p, gt=0, le=1, description="Nucleus sampling: the smallest set of tokens with this much probability (1 = off).")
    top_k: int = Field(Sampling.top_k, ge=0, description="Only the k likeliest tokens (0 = off).")
    min_p: float = Field(Sampling.min_p, ge=0, le=1, description="Only tokens at least this fraction as likely as the likeliest (0 = off).")
    repeat_penalty: float = Field(Sampling.repeat_penalty, gt=0, description="Penalty on tokens already generated in this completion (1 = off); keeps small base models from looping.")

    def sampling(self, temperature: float, max_tokens: int) -> Sampling:
        return Sampling(temperature, max_tokens, self.top_p, self.top_k, self.min_p, self.repeat_penalty)


@dataclass(frozen=True)
class Request:
    """One agent's request: the row view of a ``RequestBatch``."""

    agent_id: int
    prompt: str
    seed: int
    sampling: Sampling
    constraint: Constraint | None
    opening: str | None = None


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
        opening: chat format only (engines whose ``prompt_format`` is ``chat``): the text
            that opens each agent's assistant turn, which the model continues; ``prompt``
            is then the user's message. None: ``prompt`` is plain text to continue.
    """

    agent_id: np.ndarray
    prompt: Sequence[str]
    seed: np.ndarray
    sampling: Sampling = field(default_factory=Sampling)
    constraint: Constraint | None = None
    rule: "GameRule | None" = None
    opening: Sequence[str] | None = None

    def __len__(self) -> int:
        return len(self.agent_id)

    def __iter__(self) -> Iterator[Request]:
        openings = self.opening if self.opening is not None else [None] * len(self)
        for agent_id, prompt, seed, opening in zip(self.agent_id.tolist(), self.prompt, self.seed.tolist(), openings):
            yield Request(agent_id, prompt, seed, self.sampling, self.constraint, opening)


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
    #: Shared-context answers (``engines.shared_context``): True where the prompt was evaluated
    #: once for every agent with the same prompt; None from per-agent engines.
    shared_prompt: np.ndarray | None = None
    #: Each agent's group key (its prompt's context hash) on the shared path.
    context: list[str | None] | None = None
    #: One row per group and answer: context, answer, probability, agents (polars frame).
    distributions: Any = None

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
    """What every engine does. ``kind`` and ``model`` label every stored guess.

    ``prompt_format``: ``"chat"`` if the engine receives each prompt split into the user's
    message and the assistant's opening (``RequestBatch.opening``) and applies its model's chat
    template; ``"completion"``: prompts are plain text. ``limit_wait_s``: seconds spent waiting
    for rate limits so far (0 for engines without). ``tokens_evaluated`` and ``tokens_bound``:
    an engine that counts the work of its shared-context answers says how many tokens it has
    evaluated so far, and the least any evaluation could (None: not counted).
    ``reason_and_answer`` runs a chain of thought's two phases. ``share_answers``: the engine is
    one of a pool's ``peers`` (this one ``owner``); an engine with shared-context answers computes
    each distinct prompt's distribution once for the pool through ``board`` (``engines.shared_context.board``).
    ``EngineBase`` gives the defaults of these.
    """

    kind: str
    model: str
    prompt_format: str
    limit_wait_s: float
    tokens_evaluated: int | None
    tokens_bound: int | None

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete every request of the batch, in order. Never raises for one
        bad request: its completion carries ``error`` instead."""
        ...

    def reason_and_answer(self, free: RequestBatch, answer: RequestBatch, cue: str) -> tuple[CompletionBatch, CompletionBatch]:
        """Chain of thought: free text per agent (``free``), then its constrained ``answer``."""
        ...

    def share_answers(self, board: Board, owner: int, peers: int) -> None:
        """Compute shared-context distributions once per pool: claim and publish them on ``board``."""
        ...

    def close(self) -> None:
        """Release the model and any server connections."""
        ...


def two_phases(engine: Engine, free: RequestBatch, answer: RequestBatch, cue: str) -> tuple[CompletionBatch, CompletionBatch]:
    """Chain of thought as two ``generate`` calls: free text per agent (``free``), then its
    constrained ``answer``.

    ``answer`` holds the same prompts (and openings) as ``free``; each agent's answer prompt
    is its prompt (its opening, in chat format) followed by its free text and ``cue``.
    """
    reasoning = engine.generate(free)
    if answer.opening is not None:  # the answer continues the same assistant turn
        follow = replace(answer, opening=[o + r + cue for o, r in zip(answer.opening, reasoning.text)])
    else:
        follow = replace(answer, prompt=[p + r + cue for p, r in zip(answer.prompt, reasoning.text)])
    return reasoning, engine.generate(follow)


class EngineBase:
    """The defaults of the protocol's optional members, inherited by every engine: prompts as
    plain text, no rate-limit waits, chain of thought as two ``generate`` calls."""

    prompt_format: str = "completion"
    limit_wait_s: float = 0.0
    tokens_evaluated: int | None = None
    tokens_bound: int | None = None

    def reason_and_answer(self, free: RequestBatch, answer: RequestBatch, cue: str) -> tuple[CompletionBatch, CompletionBatch]:
        return two_phases(self, free, answer, cue)  # type: ignore[arg-type]

    def in_chat(self, batch: RequestBatch) -> bool:
        """Whether this engine renders ``batch`` as a chat: its format is chat and the batch carries
        the assistant's openings (``prompts/chat.py`` split each prompt)."""
        return batch.opening is not None and self.prompt_format == "chat"

    def share_answers(self, board: Board, owner: int, peers: int) -> None:
        """Engines that compute every prompt themselves ignore a pool's board."""


class EngineSpec(BaseModel):
    """Base of every engine's config model. Subclasses set ``kind`` as a Literal."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="Which engine: llamacpp, openai, simulated or vllm.")
    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for each Ray actor that owns this engine.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for each Ray actor that owns this engine.")

    @property
    def uses_shared_context(self) -> bool:
        """Whether the engine answers constrained batches from each distinct prompt's exact
        distribution and keeps it for later batches (shared-context answers): then a batch of a
        round's distinct prompts, answered ahead of its shards, makes them cheap and changes none."""
        return False

    @property
    def batch(self) -> int:
        """Requests one engine (one actor) serves together: a shard of fewer leaves it part idle
        (keynes sizes shards to hold at least one, ``design.shards``). 1: one at a time."""
        return 1

    @property
    def batched_choices(self) -> int | None:
        """An engine that sends its prompts to a server: the completions one request asks for, for
        agents that share a prompt (1: one request per agent); None: no requests (a model in
        process). ``keynes plan`` shows an HTTP engine's requests both ways."""
        return None

    @property
    def prefix_block(self) -> int:
        """The shared-context path keeps and evaluates prompt tokens in blocks of this many (1:
        token by token): a prompt that leaves the one before it mid-block evaluates the block's
        start again, (block − 1) / 2 tokens on average (``keynes plan`` counts them)."""
        return 1

    @property
    def model_name(self) -> str:
        """The model label stored with every guess."""
        raise NotImplementedError

    def prompting(self) -> Prompting:
        """How this engine will format prompts, resolved before a run starts and stored with it.

        Returns:
            The format (``completion`` or ``chat``) and the chat template's digest (chat only).

        Raises:
            engines.models.ModelError: the model cannot be prompted as configured
                (e.g. ``chat`` for a model without a chat template).
        """
        return Prompting("completion")

    def identity(self) -> dict[str, str]:
        """What the model is, beyond the config that names it: ``{"model <name>": digest}`` (a
        file's sha256, a folder's digest, a hub revision); empty for engines without a model."""
        return {}

    def count_tokens(self, prompts: Sequence[str]) -> np.ndarray | None:
        """Each prompt's tokens as this engine will send it (chat template, BOS and special
        tokens as the engine evaluates them), counted in this process; None when the engine
        cannot count without its server (``keynes plan`` then counts ~4 characters a token)."""
        return None

    def context_window(self) -> tuple[str, int] | None:
        """The setting that bounds prompt + completion tokens and its value, e.g. ``("n_ctx", 2048)``;
        None: not known before the engine runs (not checked)."""
        return None

    def check_context(self, prompts: Sequence[str], reserve: int, mode: str) -> None:
        """Refuse prompts that cannot fit the model's context with ``reserve`` tokens to spare
        (engines that count tokens locally and know their window; others check nothing).

        Raises:
            ValueError: one line naming the setting, the tokens needed and the limit.
        """
        window = self.context_window()
        counts = self.count_tokens(prompts) if window is not None else None
        if window is None or counts is None:
            return
        setting, limit = window
        longest = int(max(counts, default=0))
        if longest + reserve > limit:
            raise ValueError(
                f"{setting}: {limit} tokens cannot hold the longest prompt of mode {mode!r} ({longest} tokens, last round) "
                f"plus {reserve} for reasoning and answer; raise {setting} to at least {longest + reserve}"
            )

    def predicted_seconds(
        self, agents: int, rounds: int, phases: int, actors: int, seconds_per_agent: float | None, tokens_per_agent: float | None,
        shard_seconds_per_agent: float | None = None,
    ) -> float | None:
        """The play time of ``agents`` × ``rounds`` on ``actors`` actors, from a calibration's
        seconds (and tokens) per agent; None without one. Engines with their own pace override it.

        ``seconds_per_agent`` is each agent's latency; ``shard_seconds_per_agent`` the calibration
        shard's wall time over its agents, the cost of an agent to an engine that answers a
        shard's agents together in its own process (llama.cpp decoding many sequences at once,
        vLLM's batches), where every agent's latency is most of the shard's: used when given."""
        per_agent = shard_seconds_per_agent if shard_seconds_per_agent is not None else seconds_per_agent
        if per_agent is None:
            return None
        return agents * rounds * per_agent / max(1, actors)

    def price(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """What these tokens cost on this engine; None: no price configured."""
        return None

    def rate_limits(self) -> tuple[float | None, float | None]:
        """Requests and tokens per minute that every actor of this engine shares (None: no limit)."""
        return None, None

    def check_server(self) -> None:
        """Before a run starts: what this engine's server cannot give, found once.

        Raises:
            ValueError: one line naming the setting and the fix (engines without a server check nothing).
        """

    @property
    def key(self) -> str:
        """A short stable hash of this spec: one actor pool per distinct engine."""
        return spec_key(self)


def spec_key(spec: BaseModel) -> str:
    """A short stable hash of an engine's settings (an engine spec's, a mixture's)."""
    blob = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
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


def spec_union(*extra: type[BaseModel]) -> Any:
    """The type of an engine setting: every registered engine's spec (and ``extra``), told apart by ``kind``."""
    classes = tuple(spec_class(kind) for kind in available()) + extra
    return classes[0] if len(classes) == 1 else Annotated[Union[classes], Field(discriminator="kind")]


def build_engine(spec: EngineSpec) -> Engine:
    """Build the engine a spec describes (imports its library on first use)."""
    if spec.kind not in _REGISTRY:  # a spec's own module registers it: others are not imported
        _load_all()
    return _REGISTRY[spec.kind].build(spec)
