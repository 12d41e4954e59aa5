"""Exact answer distributions over HTTP from llama.cpp's own server (``llama-server``), for ``server: llamacpp``.

A node of a prompt's answer tree is one ``/completion`` request: its prompt and path as token ids,
evaluated whole (``cache_prompt`` off: llama-server's logits for a prompt depend on how the tokens its
slot held split the prompt into batches, so a reused cache would make a node's probabilities, and
the guesses drawn from them, depend on the order of the requests), one token predicted, and
``n_probs`` of the probabilities after the server's sampling chain (``post_sampling_probs``) with the
chain cut to llama.cpp's repeat penalty alone (``samplers: ["penalties"]``, over the path's tokens:
``repeat_last_n`` = the path's length). Those are the softmax over the whole vocabulary of the
penalized raw logits, so their logarithms are what ``engines.shared_context.Chain`` takes, up to a
constant it ignores; the rest of the chain (top-k, top-p, min-p, temperature) runs in numpy as for
the in-process engines. The penalty is the one step the server must do: it needs the raw logits'
signs, which no probability shows.

The server gives the ``n_probs`` likeliest tokens of its whole vocabulary. An answer token below
them is known only to be at most as likely as the last one given; a node is settled when the chain
would give such tokens probability 0 wherever they are (cut by top-k, min-p, top-p or the argmax)
and leave the others as they are; otherwise it is asked again with more (``N_PROBS``), up to the
whole vocabulary. Nothing is guessed.

The answer vocabulary comes from the served GGUF (``tokenizer``: its path or a bundled model name),
read here with llama-cpp-python and checked against the server's ``/tokenize``.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from engines.openai.dialect import PROBE_TEXT, Context, OpenAISpec, Served, ServerError, api_root
from engines.shared_context import PENALTY_LAST_N, AnswerVocab, Chain, NodeRequest

#: ``n_probs`` of a node's first request, then of each retry while its answer tokens are not settled
#: (the last is replaced by the whole vocabulary).
N_PROBS = (64, 1024, 16384)
#: How to start the server for the exact path (docs/engines.md).
COMMAND = "llama-server -m MODEL.gguf --alias NAME --host 127.0.0.1 --port 8080"


def tokenize_body(prompt: str) -> dict[str, Any]:
    """``/tokenize`` as ``/completion`` tokenizes a text prompt: the model's BOS, special tokens parsed."""
    return {"content": prompt, "add_special": True, "parse_special": True}


def step_body(prompt: list[int], path: tuple[int, ...], chain: Chain, n_probs: int) -> dict[str, Any]:
    """One node: the probabilities after llama.cpp's repeat penalty over the path, of the ``n_probs``
    likeliest tokens after ``prompt + path``."""
    last = min(len(path), PENALTY_LAST_N) if chain.repeat_penalty != 1.0 else 0
    return {"prompt": list(prompt) + list(path), "n_predict": 1, "n_probs": n_probs, "post_sampling_probs": True,
            "samplers": ["penalties"], "repeat_penalty": chain.repeat_penalty if last else 1.0, "repeat_last_n": last,
            "frequency_penalty": 0.0, "presence_penalty": 0.0, "cache_prompt": False, "seed": 0}


def top_probs(response: dict[str, Any]) -> dict[int, float]:
    """The step's log-probabilities by token id (``completion_probabilities[0].top_probs``)."""
    steps = response.get("completion_probabilities") or [{}]
    return {int(t["id"]): math.log(t["prob"]) for t in steps[0].get("top_probs") or [] if t.get("prob", 0) > 0}


def settle(tokens: np.ndarray, step: dict[int, float], asked: int, chain: Chain) -> np.ndarray | None:
    """The values of a node's answer tokens from one step, or None if tokens the step did not give
    could change the node's probabilities.

    ``step`` holds the ``asked`` likeliest tokens (fewer: every other token's probability is 0 in
    float32). ``chain`` is the chain after the penalty (the server's). A token not given is at most
    the last given; it is settled at -inf when, at that bound, the chain gives it probability 0 and
    keeps the same tokens as at -inf (the chain's cuts move one way as a token's value falls).
    """
    z = np.array([step.get(int(t), -np.inf) for t in tokens], np.float64)
    missing = ~np.isfinite(z)
    if not missing.any() or len(step) < asked:
        return z
    if missing.all():
        return None
    high = z.copy()
    high[missing] = min(step.values())
    low_p, high_p = chain.probabilities(tokens, z), chain.probabilities(tokens, high)
    return z if (high_p[missing] == 0).all() and ((low_p > 0) == (high_p > 0)).all() else None


class LlamaServerDialect:
    """What the exact path asks llama-server and how it reads the answers."""

    def tokenize(self, spec: OpenAISpec, prompt: str) -> tuple[str, dict[str, Any]]:
        if spec.prompt_format == "chat":
            raise ServerError(f"prompt_format: chat is not taken by the exact path over llama-server; set prompt_format: completion "
                              "or shared_context: false")
        return f"{api_root(spec.base_url)}/tokenize", tokenize_body(prompt)

    def walk_chain(self, chain: Chain) -> Chain:
        """The chain the walk applies: the server has applied the repeat penalty."""
        return replace(chain, repeat_penalty=1.0)

    async def evaluate(self, ctx: Context, prompts: list[list[int]], requests: list[NodeRequest], chain: Chain) -> list[np.ndarray]:
        """One tree level: a request per node, ``concurrency`` at a time."""
        ctx.nodes += len(requests)
        url = f"{api_root(ctx.spec.base_url)}/completion"
        limit = asyncio.Semaphore(ctx.spec.concurrency)
        after = self.walk_chain(chain)

        async def one(prompt: list[int], request: NodeRequest) -> np.ndarray:
            for asked in [n for n in N_PROBS if n < ctx.n_vocab] + [ctx.n_vocab]:
                async with limit:
                    ctx.steps += 1
                    step = top_probs(await ctx.post(url, step_body(prompt, request.path, chain, asked), 0))
                found = settle(request.tokens, step, asked, after)
                if found is not None:
                    return found.astype(np.float32)
            raise ServerError(f"server: llamacpp: the server gave {len(step)} of the {ctx.n_vocab} tokens' probabilities")

        return list(await asyncio.gather(*(one(p, r) for p, r in zip(prompts, requests))))

    def check(self, client: httpx.Client, spec: OpenAISpec, base: str, model: dict[str, Any]) -> Served:
        """The server's split of the probe text, the GGUF's answer vocabulary, and one step with
        ``n_probs`` read back; the context and vocabulary sizes from ``/v1/models``."""
        root = api_root(base)
        url, body = self.tokenize(spec, PROBE_TEXT)
        tokenized = client.post(url, json=body)
        if tokenized.status_code != 200:
            raise ServerError(f"server: llamacpp: {url} answered HTTP {tokenized.status_code}; exact answers need llama.cpp's "
                              f"llama-server ({COMMAND}); for llama-cpp-python's server set shared_context: false")
        probe = [int(t) for t in tokenized.json()["tokens"]]
        vocab = gguf_vocab(spec, probe)
        meta = model.get("meta") or {}
        n_vocab, n_ctx = int(meta.get("n_vocab") or 0), int(meta.get("n_ctx") or 0)
        if not n_vocab or not n_ctx:
            raise ServerError(f"server: llamacpp: {base}/models gives no meta.n_vocab and meta.n_ctx; exact answers need "
                              f"llama.cpp's llama-server ({COMMAND})")
        answer = client.post(f"{root}/completion", json=step_body(probe, (), Chain(), 8))
        step = top_probs(answer.json()) if answer.status_code == 200 else {}
        if len(step) != 8 or not all(0 <= t < n_vocab for t in step):
            raise ServerError(f"server: llamacpp: {root}/completion gives no post-sampling probabilities (n_probs, post_sampling_probs; "
                              f"HTTP {answer.status_code}); exact answers need llama.cpp's llama-server ({COMMAND})")
        return Served(vocab, n_ctx, n_vocab)


def gguf_vocab(spec: OpenAISpec, probe: list[int]) -> AnswerVocab:
    """The answer vocabulary of the served GGUF (``tokenizer``, default ``model``: a bundled model
    name or a path), whose split of the probe text must be the server's."""
    from engines.models import MODELS, gguf_path

    source = spec.tokenizer or spec.model
    if source not in MODELS and not (source.endswith(".gguf") and Path(source).expanduser().is_file()):
        raise ServerError(f"tokenizer: {source!r} is neither a bundled model ({', '.join(sorted(MODELS))}) nor a .gguf file; "
                          "set tokenizer to the GGUF llama-server serves")
    try:
        from engines.llamacpp import gguf_tokens
    except ImportError as exc:
        raise ServerError(f"tokenizer: reading {source!r}'s tokens needs llama-cpp-python ({exc}); uv sync --extra llamacpp") from None
    vocab, ours = gguf_tokens(gguf_path(source), PROBE_TEXT)
    if ours != probe:
        raise ServerError(f"tokenizer: {source!r} splits the probe text into {ours[:12]}… but the server into {probe[:12]}…; "
                          "set tokenizer to the GGUF llama-server serves")
    return vocab
