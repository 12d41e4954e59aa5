"""Chat format: a game prompt as an instruct model's conversation, in the model's own template.

The rendered prompt's body becomes the user message and its last line (the cue: "My number
is:", or the opening words of the reasoning) opens the assistant's turn, so the constrained
answer or the reasoning continues the assistant's own words. Templates are rendered the way
Hugging Face and llama.cpp render chat templates: a sandboxed Jinja2 environment.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Sequence

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

#: How a model is prompted: ``completion`` continues plain text (base models), ``chat`` wraps
#: the prompt in the model's chat template (instruct models).
PromptFormat = Literal["completion", "chat"]
PROMPT_FORMATS: tuple[str, ...] = ("completion", "chat")


def split_cue(prompt: str) -> tuple[str, str]:
    """Split a rendered prompt into the user's message and the assistant's opening.

    Every mode's template ends with one line that the model continues (``My number is:``,
    ``Reasoning: Let's think step by step. First,``): in chat format that line opens the
    assistant's turn. A one-line prompt is all user message.

    Returns:
        (user message without trailing whitespace, the cue line).
    """
    user, newline, cue = prompt.rpartition("\n")
    if not newline:
        return prompt, ""
    return user.rstrip(), cue


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    # The options and extensions of transformers' chat-template environment (and of
    # llama-cpp-python's Jinja2ChatFormatter, which follows it).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    return env.from_string(source)


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template (Jinja2 source) with the special tokens it refers to.

    Attributes:
        source: the template, e.g. a GGUF's ``tokenizer.chat_template`` metadata.
        bos_token: the text of the model's begin-of-sequence token.
        eos_token: the text of its end-of-sequence token.
    """

    source: str
    bos_token: str = ""
    eos_token: str = ""

    @property
    def sha256(self) -> str:
        """The digest of the template's source: stored with each run that used it."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def render(self, user: str, opening: str = "") -> str:
        """The text the model continues: the user's message, then the assistant's turn,
        opened (by the generation prompt of the template) and continued with ``opening``."""
        head = _compile(self.source).render(
            messages=[{"role": "user", "content": user}],
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            raise_exception=_raise_exception,
        )
        return head + opening

    def render_all(self, users: Sequence[str], openings: Sequence[str]) -> list[str]:
        """``render`` for a batch; equal pairs are rendered once (agents share prompts)."""
        cache: dict[tuple[str, str], str] = {}
        out = []
        for pair in zip(users, openings):
            text = cache.get(pair)
            if text is None:
                text = cache[pair] = self.render(*pair)
            out.append(text)
        return out


def split_cues(prompts: Sequence[str]) -> tuple[list[str], list[str]]:
    """``split_cue`` for a batch: (user messages, assistant openings)."""
    cache: dict[str, tuple[str, str]] = {}
    users, cues = [], []
    for prompt in prompts:
        pair = cache.get(prompt)
        if pair is None:
            pair = cache[prompt] = split_cue(prompt)
        users.append(pair[0])
        cues.append(pair[1])
    return users, cues
