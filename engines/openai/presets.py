"""What each kind of OpenAI-compatible server takes: the ``server:`` presets of the openai engine.

A preset fills the settings a user leaves unset (``prompt_format``, ``constraint_fields``,
``shared_context``, ``completions_per_request``); every one can still be set by hand. ``generic``,
the default, sends one request per agent with both constraint dialects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Server = Literal["generic", "vllm", "llamacpp", "openai"]
ConstraintField = Literal["grammar", "structured_outputs", "guided_regex", "response_format"]


@dataclass(frozen=True)
class Preset:
    """The defaults one kind of server gets."""

    prompt_format: Literal["completion", "chat"]
    constraint_fields: tuple[ConstraintField, ...]
    shared_context: bool
    about: str
    #: Completions asked for in one request (``n``) by agents that share a prompt; 1: one request per agent.
    completions_per_request: int = 1


PRESETS: dict[str, Preset] = {
    "generic": Preset("completion", ("grammar", "structured_outputs"), False,
                      "any OpenAI-compatible server: /completions, both constraint dialects, one request per agent"),
    "vllm": Preset("completion", ("structured_outputs",), True,
                   "vLLM's OpenAI server: exact answer distributions from raw logits (logprob_token_ids), "
                   "structured outputs for the rest"),
    "llamacpp": Preset("completion", ("grammar",), True,
                       "llama.cpp's llama-server: exact answer distributions from its post-sampling probabilities (n_probs), a GBNF "
                       "grammar for the rest; llama-cpp-python's server takes shared_context: false"),
    "openai": Preset("chat", (), False,
                     "a hosted API: chat completions, no grammar fields (response_format, a JSON schema, when asked for), "
                     "agents that share a prompt answered by up to 128 completions of one request (OpenAI's limit of n)", 128),
}
