"""The openai engine: any OpenAI-compatible server (vLLM, llama.cpp, a hosted API) over HTTP.

Requests of a batch run concurrently (up to ``concurrency``) on an asyncio loop owned by
the engine; 429, 5xx, timeouts and connection errors are retried with exponential
backoff, a ``Retry-After`` honoured. ``requests_per_minute``/``tokens_per_minute`` are kept
by all actors of the engine together (``engines.limits``). Servers may silently ignore
constraint fields, so every answer is validated and resampled (a fresh seed) a few times
before it is stored as an error.

With ``completions_per_request`` n > 1, agents of a batch that share a prompt are answered by
``n`` completions of one request (``_SharedRequests``), reasoning and answers alike; a server
that answers fewer choices than asked (one that ignores ``n``) is warned about once and the
engine sends one request per agent from then on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import threading
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

import httpx
import numpy as np
from pydantic import Field, model_validator

from engines import Completion, CompletionBatch, Constraint, EngineBase, EngineSpec, Request, RequestBatch, ServerPrompting
from engines.limits import Limiter
from engines.openai.endpoint import auth_headers, check_endpoint
from engines.openai.presets import PRESETS, ConstraintField, Server
from engines.shared_context import Chain, applies, prompt_groups
from prompts.answers import number_gbnf
from prompts.chat import PromptFormat

if TYPE_CHECKING:
    from engines.shared_context import Board

#: Status codes worth retrying: rate limits and server-side failures.
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAISpec(EngineSpec):
    """A model served by an OpenAI-compatible HTTP server."""

    kind: Literal["openai"] = "openai"
    base_url: str = Field(description="The server's API root, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(description="The model name the server expects (stored with every guess).")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Name of the environment variable that holds the API key (the key itself is never stored); unset or empty = no key.")
    server: Server = Field(
        "generic",
        description="What kind of server answers; sets the defaults of prompt_format, constraint_fields and shared_context. "
        "generic: per agent, both constraint dialects; vllm: vLLM's OpenAI server, exact distributions (start it with "
        "--logprobs-mode raw_logits --max-logprobs 128); llamacpp: llama.cpp's llama-server, exact; openai: a hosted API (chat).",
    )
    prompt_format: PromptFormat | None = Field(
        None,
        description="completion: /completions, the prompt as text to continue (base models); chat: /chat/completions, the "
        "prompt as the user's message and its cue as the assistant's opening, in the server's chat template (instruct models). "
        "Default: the server preset's (chat for openai, else completion).",
    )
    constraint_fields: tuple[ConstraintField, ...] | None = Field(
        None,
        description="How the answer constraint is sent: grammar = GBNF (llama.cpp servers), structured_outputs = {regex} (vLLM), "
        "guided_regex (older vLLM), response_format = a JSON schema {answer: number} (hosted APIs); []: none (answers are "
        "validated either way). Default: the server preset's.",
    )
    completions_per_request: int | None = Field(
        None, ge=1,
        description="Agents that share a prompt are answered by up to this many completions of one request (the API's n; "
        "OpenAI's chat completions take 128), in agent-id order, seeded by the first agent; 1: a request per agent; a server "
        "that ignores n is answered per agent. Default: the preset's (128 for openai, else 1).",
    )
    shared_context: bool | None = Field(
        None,
        description="Constrained answers from the exact answer distribution of each distinct prompt (the raw logits of the "
        "answer tree's nodes over HTTP, llama.cpp's sampling chain), drawn per agent with its seed: needs vLLM's server "
        "(--logprobs-mode raw_logits --max-logprobs 128) or llama.cpp's llama-server. Default: true for server vllm and "
        "llamacpp, else false (one request per agent).",
    )
    tokenizer: str | None = Field(
        None,
        description="Shared context only: the served model's tokenizer, loaded here for its answer tokens (vllm: a Hugging "
        "Face folder or hub id; llamacpp: the served .gguf file; either: a bundled model name); checked against the server's "
        "/tokenize at start. Default: model.",
    )
    concurrency: int = Field(16, gt=0, description="Requests in flight at once per engine (per Ray actor).")
    timeout_s: float = Field(60.0, gt=0, description="Seconds before one HTTP request times out.")
    max_attempts: int = Field(8, gt=0, description="HTTP attempts per request (429, 5xx, timeouts and connection errors are retried).")
    backoff_s: float = Field(0.5, ge=0, description="First retry delay; doubles with every attempt (with jitter).")
    max_backoff_s: float = Field(15.0, ge=0, description="Longest retry delay.")
    resamples: int = Field(2, ge=0, description="Extra samples (fresh seeds) when an answer does not match the constraint.")
    stop: tuple[str, ...] = Field(("\n\n",), description="Stop sequences of free-text (reasoning) requests.")
    num_cpus: float = Field(0.25, ge=0, description="CPUs reserved for each Ray actor (an HTTP client needs little).")
    requests_per_minute: float | None = Field(None, gt=0, description="At most this many requests per minute across all actors of this engine (a hosted API's limit); none = no limit. Spread evenly: rpm/60 per second.")
    tokens_per_minute: float | None = Field(None, gt=0, description="At most this many tokens (prompt + completion) per minute across all actors; a request counts ~4 characters per prompt token plus max_tokens until the server reports its usage.")
    prompt_price_per_million: float | None = Field(None, ge=0, description="Price of a million prompt tokens (any currency), for `keynes plan`'s cost estimate.")
    completion_price_per_million: float | None = Field(None, ge=0, description="Price of a million completion tokens (same currency), for `keynes plan`.")
    max_retry_after_s: float = Field(120.0, ge=0, description="Longest Retry-After a 429/503 answer may impose (every actor waits it out before sending again).")

    @model_validator(mode="after")
    def _preset(self) -> "OpenAISpec":
        """Fill what is unset from the server preset (``engines.openai.presets``)."""
        preset = PRESETS[self.server]
        for name in ("prompt_format", "constraint_fields", "shared_context", "completions_per_request"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(preset, name))
        return self

    @property
    def uses_shared_context(self) -> bool:
        return bool(self.shared_context)

    @property
    def batch(self) -> int:
        return self.concurrency

    @property
    def batched_choices(self) -> int:
        return int(self.completions_per_request or 1)

    @property
    def model_name(self) -> str:
        return self.model

    def prompting(self) -> ServerPrompting:
        """The configured format; the chat template is the server's (not visible to keynes)."""
        return ServerPrompting(self.prompt_format)

    def identity(self) -> dict[str, str]:
        """The server, the model name it serves and what the server reports of that model
        (``engines.openai.exact.served_report``: its ``/models`` entry — vLLM's ``root`` and
        ``max_model_len``, llama-server's file size, parameters and vocabulary); without the report
        when the server does not answer (the run's own requests then say why)."""
        from engines.identity import REPORTED
        from engines.openai.exact import served_report

        served = f"served:{self.base_url.rstrip('/')} {self.model}"
        report = served_report(self)
        return {f"model {self.model}": f"{served} {REPORTED}{report}" if report else served}

    def rate_limits(self) -> tuple[float | None, float | None]:
        return self.requests_per_minute, self.tokens_per_minute

    def check_server(self) -> None:
        """With ``shared_context``: what the server cannot give for exact answers, in one line
        naming the setting (``engines.openai.exact.check_server``). A hosted API (``server: openai``):
        its key set, the server up, the key taken and the model served (``check_endpoint``). Other
        servers per agent: nothing checked (llama.cpp's answers whatever model name it is sent)."""
        if self.shared_context:
            from engines.openai.exact import check_server

            check_server(self)
        elif self.server == "openai":
            if self.api_key_env and not os.environ.get(self.api_key_env):
                raise ValueError(f"api_key_env: ${self.api_key_env} is not set; a hosted API needs its key there "
                                 "(or set api_key_env: null for a server without keys)")
            with httpx.Client(headers=auth_headers(self), timeout=self.timeout_s) as client:
                check_endpoint(client, self)

    def predicted_seconds(
        self, agents: int, rounds: int, phases: int, actors: int, seconds_per_agent: float | None, tokens_per_agent: float | None,
        shard_seconds_per_agent: float | None = None,
    ) -> float | None:
        """``concurrency`` requests in flight per actor, held to ``requests_per_minute`` and
        ``tokens_per_minute`` (the limit, not the server, may set the pace)."""
        if seconds_per_agent is None:
            return None
        seconds = agents * rounds * seconds_per_agent / (max(1, actors) * self.concurrency)
        if self.requests_per_minute:
            seconds = max(seconds, agents * rounds * phases / self.requests_per_minute * 60)
        if self.tokens_per_minute and tokens_per_agent is not None:
            seconds = max(seconds, agents * rounds * tokens_per_agent / self.tokens_per_minute * 60)
        return seconds

    def price(self, prompt_tokens: float, completion_tokens: float) -> float | None:
        """At ``prompt_price_per_million`` and ``completion_price_per_million``; None if neither is set."""
        if self.prompt_price_per_million is None and self.completion_price_per_million is None:
            return None
        return prompt_tokens / 1e6 * (self.prompt_price_per_million or 0.0) + completion_tokens / 1e6 * (self.completion_price_per_million or 0.0)


class OpenAIEngine(EngineBase):
    """Sends each request to the server, concurrently, with retries and validation."""

    kind = "openai"

    def __init__(self, spec: OpenAISpec):
        self.spec = spec
        self.model = spec.model_name
        self.prompt_format: str = spec.prompt_format or "completion"
        self._headers = auth_headers(spec)
        # One event loop per engine, on its own thread: generate() is called from plain
        # (possibly Ray actor) threads and must work whether or not a loop already runs there.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-engine", daemon=True)
        self._thread.start()
        self._client = self._call(self._open())
        # On Ray these are the run's shared limits (one named actor for all actors of this engine).
        self.limits = Limiter(spec.key, spec.requests_per_minute, spec.tokens_per_minute) if (
            spec.requests_per_minute or spec.tokens_per_minute) else None
        self._exact: Any = None
        #: Completions asked for in one request; 1 once the server is found to ignore ``n``.
        self.per_request = spec.batched_choices
        #: Requests sent for completions (retries and resamples included): what the server billed.
        self.requests = 0
        if spec.shared_context:  # checks the server once (engines.openai.exact.check_server)
            from engines.openai.exact import HttpSharedContext

            self._exact = HttpSharedContext(spec, self._request, self._call)

    @property
    def limit_wait_s(self) -> float:
        """Seconds this engine's requests have waited on rate limits so far."""
        return self.limits.waited_s if self.limits is not None else 0.0

    async def _open(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.spec.concurrency, max_keepalive_connections=self.spec.concurrency)
        return httpx.AsyncClient(
            base_url=self.spec.base_url.rstrip("/") + "/", headers=self._headers, timeout=self.spec.timeout_s, limits=limits
        )

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete every request; constrained answers are validated against the range. With
        ``shared_context``, a constrained batch is answered from each distinct prompt's exact
        distribution (``engines.openai.exact``); free text is sampled per agent."""
        if self._exact is not None and applies(batch.constraint) and len(batch):
            return self._exact.generate(batch, Chain.of(batch.sampling))
        if self.per_request > 1 and len(batch) > 1:
            return CompletionBatch.from_rows(self._call(_SharedRequests(self, batch).run()))
        return CompletionBatch.from_rows(self._call(self._generate(batch)))

    def share_answers(self, board: Board, owner: int, peers: int) -> None:
        """Compute each shared-context distribution once for the pool (``engines.shared_context.board``)."""
        if self._exact is not None:
            self._exact.answers.share(board, owner, peers)

    async def _generate(self, batch: RequestBatch) -> list[Completion]:
        semaphore = asyncio.Semaphore(self.spec.concurrency)
        pattern = re.compile(batch.constraint.regex) if batch.constraint is not None else None

        async def one(request: Request) -> Completion:
            async with semaphore:
                return await self._complete(request, pattern)

        return list(await asyncio.gather(*(one(r) for r in batch)))

    async def _complete(self, request: Request, pattern: re.Pattern[str] | None) -> Completion:
        """Sample (and resample while the answer is invalid), retrying transport failures."""
        start = time.perf_counter()
        attempts = prompt_tokens = completion_tokens = 0
        text, error = "", None
        for sample in range(self.spec.resamples + 1 if pattern is not None else 1):
            body = self._body(request, sample)
            response, tries, error = await self._post(body, request.seed + sample)
            attempts += tries
            if response is None:
                break  # the retry budget is spent: the server is not answering
            usage = response.get("usage") or {}
            prompt_tokens += int(usage.get("prompt_tokens") or 0)
            completion_tokens += int(usage.get("completion_tokens") or 0)
            text, error = self._answer(_texts(response, self.spec.prompt_format)[0], pattern, request.constraint, sample)
            if error is None:
                break
        return Completion(text, prompt_tokens, completion_tokens, time.perf_counter() - start, attempts, error)

    def _answer(self, text: str, pattern: re.Pattern[str] | None, constraint: Constraint | None, sample: int) -> tuple[str, str | None]:
        """A completion's text as stored (a constrained one stripped, its JSON answer read) and
        the error that makes it invalid (None: valid, or free text)."""
        if pattern is None:
            return text, None
        text = text.strip()
        if "response_format" in self.spec.constraint_fields:
            text = _json_answer(text)
        if pattern.fullmatch(text) or constraint is None:
            return text, None
        return text, (f"answer {text[:80]!r} is not a number in [{constraint.low:g}, {constraint.high:g}] after {sample + 1} "
                      "sample(s); does the server ignore the constraint fields?")

    def _body(self, request: Request, sample: int) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.spec.model,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": (request.seed + sample) & 0x7FFFFFFF,
        }
        if self.spec.prompt_format == "chat":
            body["messages"] = [{"role": "user", "content": request.prompt}]
            if request.opening:
                # The assistant's opening as its last message: servers that continue a final
                # assistant message (prefill) continue it; others answer in a new turn after it.
                body["messages"].append({"role": "assistant", "content": request.opening})
        else:
            body["prompt"] = request.prompt
        if request.constraint is None:
            if self.spec.stop:
                body["stop"] = list(self.spec.stop)
        else:
            body.update(_constraint_fields(request.constraint, self.spec.constraint_fields))
        return body

    async def _request(self, url: str, body: dict[str, Any], seed: int) -> dict[str, Any]:
        """POST to ``url`` with the retries of every request; raises when they are spent."""
        response, _, error = await self._post(body, seed, url)
        if response is None:
            raise RuntimeError(f"{url}: {error}")
        return response

    async def _post(self, body: dict[str, Any], seed: int, path: str | None = None) -> tuple[dict[str, Any] | None, int, str | None]:
        """POST with retries (to ``path``, default the prompt format's endpoint). Returns (response
        JSON or None, attempts, last error)."""
        path = path or ("chat/completions" if self.spec.prompt_format == "chat" else "completions")
        jitter = random.Random(seed)
        error: str | None = None
        estimate = _token_estimate(body)
        for attempt in range(1, self.spec.max_attempts + 1):
            retry_after: float | None = None
            if self.limits is not None:
                await self.limits.acquire(estimate)
            if path.endswith("completions"):
                self.requests += 1
            try:
                response = await self._client.post(path, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            else:
                if response.status_code == 200:
                    try:
                        answer = response.json()
                    except ValueError:
                        error = f"HTTP 200 with a body that is not JSON: {response.text[:200]!r}"
                    else:
                        if self.limits is not None:
                            used = (answer.get("usage") or {}).get("total_tokens")
                            if used is not None:
                                self.limits.settle(float(used) - estimate)
                        return answer, attempt, None
                else:
                    error = f"HTTP {response.status_code}: {response.text[:300]}"
                    if response.status_code not in RETRY_STATUS:
                        return None, attempt, error  # a bad request does not get better by waiting
                    retry_after = _retry_after(response)
                    if retry_after is not None:
                        retry_after = min(retry_after, self.spec.max_retry_after_s)
                        if self.limits is not None:  # the server said when: nobody sends before then
                            self.limits.hold(retry_after)
            if attempt < self.spec.max_attempts:
                delay = min(self.spec.max_backoff_s, self.spec.backoff_s * 2 ** (attempt - 1)) * (0.5 + jitter.random() / 2)
                await asyncio.sleep(max(delay, retry_after or 0.0))
        return None, self.spec.max_attempts, f"gave up after {self.spec.max_attempts} attempts: {error}"

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._client.aclose())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()


class _SharedRequests:
    """A batch answered by ``n`` completions a request: the agents that share a prompt (and an
    opening) in agent-id order, cut into requests of ``per_request``, each seeded by its first agent
    (+ the sample number); an invalid answer's agents are asked again the same way, up to
    ``resamples`` times. A request's prompt tokens are shared equally by its agents, its completion
    tokens in proportion to each answer's length, and its time equally: a batch's sums are the
    server's. Agents a request got no choice for (a server that ignores ``n``) are answered per agent."""

    def __init__(self, engine: OpenAIEngine, batch: RequestBatch):
        self.engine, self.batch = engine, batch
        self.requests = list(batch)
        n = len(self.requests)
        self.text = [""] * n
        self.error: list[str | None] = [None] * n
        self.prompt_tokens = [0] * n
        self.completion_tokens = [0] * n
        self.latency_s = [0.0] * n
        self.attempts = [0] * n
        self.done: list[Completion | None] = [None] * n  # agents answered per agent
        self.pattern = re.compile(batch.constraint.regex) if batch.constraint is not None else None

    async def run(self) -> list[Completion]:
        spec = self.engine.spec
        openings = self.batch.opening if self.batch.opening is not None else [""] * len(self.requests)
        ids = np.asarray(self.batch.agent_id)
        _, members = prompt_groups([f"{p}\x1f{o}" for p, o in zip(self.batch.prompt, openings)])
        pending = [rows[np.argsort(ids[rows], kind="stable")].tolist() for rows in members]
        semaphore = asyncio.Semaphore(spec.concurrency)
        for sample in range(spec.resamples + 1 if self.pattern is not None else 1):
            size = self.engine.per_request
            parts = [(g, rows[k:k + size]) for g, rows in enumerate(pending) for k in range(0, len(rows), size)]
            if not parts:
                break

            async def one(rows: list[int]) -> list[int]:
                async with semaphore:
                    return await self._ask(rows, sample)

            again = await asyncio.gather(*(one(rows) for _, rows in parts))
            # A prompt's invalid answers, from all its requests, are asked again together (in agent-id order).
            merged: dict[int, list[int]] = {}
            for (g, _), rows in zip(parts, again):
                merged.setdefault(g, []).extend(rows)
            pending = [rows for rows in merged.values() if rows]
        return [done or Completion(self.text[i], self.prompt_tokens[i], self.completion_tokens[i], self.latency_s[i],
                                   self.attempts[i], self.error[i]) for i, done in enumerate(self.done)]

    async def _ask(self, rows: list[int], sample: int) -> list[int]:
        """One request for the agents ``rows`` (one prompt); returns those whose answer is invalid."""
        engine = self.engine
        first = self.requests[rows[0]]
        body = engine._body(first, sample)
        if len(rows) > 1:
            body["n"] = len(rows)
        start = time.perf_counter()
        response, tries, error = await engine._post(body, first.seed + sample)
        share = (time.perf_counter() - start) / len(rows)
        for i in rows:
            self.attempts[i] += tries
            self.latency_s[i] += share
        if response is None:  # the retry budget is spent: every agent of the request keeps the error
            for i in rows:
                self.error[i] = error
            return []
        texts = _texts(response, engine.spec.prompt_format)[: len(rows)]
        usage = response.get("usage") or {}
        prompt = _shares(int(usage.get("prompt_tokens") or 0), [1] * len(texts))
        completion = _shares(int(usage.get("completion_tokens") or 0), [len(t) + 1 for t in texts])
        invalid = []
        for i, text, p, c in zip(rows, texts, prompt, completion):
            self.prompt_tokens[i] += p
            self.completion_tokens[i] += c
            self.text[i], self.error[i] = engine._answer(text, self.pattern, first.constraint, sample)
            if self.error[i] is not None:
                invalid.append(i)
        if len(texts) < len(rows):  # the server ignores n: these agents, and every later batch, per agent
            if engine.per_request > 1:
                engine.per_request = 1
                logging.getLogger("keynes.engines.openai").warning(
                    "completions_per_request: the server at %s answered %d choice(s) for n=%d; sending one request per "
                    "agent (set completions_per_request: 1)", engine.spec.base_url, len(texts), len(rows))
            rest = await asyncio.gather(*(engine._complete(self.requests[i], self.pattern) for i in rows[len(texts):]))
            for i, done in zip(rows[len(texts):], rest):
                self.done[i] = Completion(done.text, done.prompt_tokens, done.completion_tokens, self.latency_s[i] + done.latency_s,
                                          self.attempts[i] + done.attempts, done.error)
        return invalid


def _shares(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` in whole numbers that sum to it (largest remainders)."""
    if not weights:
        return []
    exact = np.asarray(weights, np.float64) * total / max(sum(weights), 1)
    out = np.floor(exact).astype(np.int64)
    out[np.argsort(out - exact, kind="stable")[: total - int(out.sum())]] += 1
    return out.tolist()


def _constraint_fields(constraint: Constraint, fields: tuple[str, ...]) -> dict[str, Any]:
    """The request fields that ask a server to constrain the answer, in each server's dialect."""
    out: dict[str, Any] = {}
    if "grammar" in fields:
        out["grammar"] = number_gbnf(constraint.low, constraint.high, constraint.integer)
    if "structured_outputs" in fields:
        out["structured_outputs"] = {"regex": constraint.regex}
    if "guided_regex" in fields:
        out["guided_regex"] = constraint.regex
    if "response_format" in fields:
        number = {"type": "integer" if constraint.integer else "number", "minimum": constraint.low, "maximum": constraint.high}
        schema = {"type": "object", "properties": {"answer": number}, "required": ["answer"], "additionalProperties": False}
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": schema}}
    return out


def _json_answer(text: str) -> str:
    """The number of a ``response_format`` answer (``{"answer": 42}``) as text; other text as it is."""
    try:
        value = json.loads(text)["answer"]
    except (ValueError, TypeError, KeyError):
        return text
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return text
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}".rstrip("0")


def _texts(response: dict[str, Any], prompt_format: str) -> list[str]:
    """Each choice's text, by its index (at least one: empty when the server sent none)."""
    choices = sorted(response.get("choices") or [{}], key=lambda c: int(c.get("index") or 0))
    if prompt_format == "chat":
        return [(c.get("message") or {}).get("content") or "" for c in choices]
    return [c.get("text") or "" for c in choices]


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime

        return max(0.0, (parsedate_to_datetime(value) - datetime.now(timezone.utc)).total_seconds())
    except (TypeError, ValueError):
        return None


def _token_estimate(body: dict[str, Any]) -> float:
    """Tokens a request will use before the server says: ~4 characters a token, plus max_tokens for each of its n choices."""
    text = body.get("prompt") or "".join(m.get("content", "") for m in body.get("messages", []))
    return len(text) / 4 + int(body.get("max_tokens") or 0) * int(body.get("n") or 1)

