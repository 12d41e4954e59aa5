"""What the exact path over HTTP shares with each kind of server's request adapter (``Dialect``):
the spec it reads, the start-up check's findings and errors, the state a walk keeps.

``engines.openai.exact`` walks the trees and picks the dialect (vLLM's there, llama-server's in
``engines.openai.llama_server``); a dialect knows nothing of the walk beyond ``Context``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import httpx
import numpy as np

from engines.shared_context import AnswerVocab, Chain, NodeRequest

#: Text both tokenizers must split alike (digits, spaces, a decimal point, words).
PROBE_TEXT = "Guess a number: 42, 7.5 or  100?\nMy number is: 3"


class OpenAISpec(Protocol):
    """What the exact path reads of the openai engine's spec (``engines.openai.engine.OpenAISpec``)."""

    server: str
    base_url: str
    model: str
    api_key_env: str | None
    tokenizer: str | None
    prompt_format: str | None
    timeout_s: float
    concurrency: int

    @property
    def key(self) -> str: ...


class ServerError(ValueError):
    """What the server cannot give, in one line naming the setting and the fix."""


@dataclass(frozen=True)
class Served:
    """What the start-up check found: the answer vocabulary, the server's context length and
    (where the dialect needs it) its vocabulary's size."""

    vocab: AnswerVocab
    max_model_len: int
    n_vocab: int = 0


class Context(Protocol):
    """What a dialect reads and counts of the walk that calls it (``engines.openai.exact.HttpSharedContext``)."""

    spec: OpenAISpec
    post: Callable[[str, dict[str, Any], int], Awaitable[dict[str, Any]]]
    n_vocab: int
    steps: int  # node requests sent
    nodes: int  # tree nodes evaluated


class Dialect(Protocol):
    """How the exact path asks one kind of server: a prompt's tokens, a tree level's logits, the
    start-up check (after ``/models`` said the server is up and serves the model)."""

    def tokenize(self, spec: OpenAISpec, prompt: str) -> tuple[str, dict[str, Any]]:
        """The URL and body of a prompt's ``/tokenize`` request (the answer holds ``tokens``)."""
        ...

    def walk_chain(self, chain: Chain) -> Chain:
        """The chain the walk applies to the values ``evaluate`` returns."""
        ...

    async def evaluate(self, ctx: Context, prompts: list[list[int]], requests: list[NodeRequest],
                       chain: Chain) -> list[np.ndarray]:
        """Each request's values of its allowed tokens, after its prompt's ids (``EvaluateIds``)."""
        ...

    def check(self, client: httpx.Client, spec: OpenAISpec, base: str, model: dict[str, Any]) -> Served:
        """What the exact path needs from the server (``model``: its ``/models`` entry), or ``ServerError``."""
        ...



def api_root(base_url: str) -> str:
    """The server's root, where vLLM serves ``/tokenize`` (``base_url`` less its ``/v1``)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root
