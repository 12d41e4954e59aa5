"""The llama.cpp engine: a GGUF model on CPU through llama-cpp-python, the laptop default.

The default model is Gemma 3 270M, assembled from its PyPI package on first use (see
``engines.models``). Answers are constrained by a GBNF grammar to a number in the
game's range; requests run in prompt order so the KV cache reuses shared prefixes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from engines import Completion, CompletionBatch, Constraint, EngineSpec, Request, RequestBatch, register
from engines.models import DEFAULT_MODEL, MODELS, gguf_path
from prompts.answers import number_gbnf

#: llama.cpp reads this seed as "pick one at random": never pass it.
_RANDOM_SEED = 0xFFFFFFFF


class LlamaCppSpec(EngineSpec):
    """A GGUF model on llama.cpp (CPU), one model instance per Ray actor."""

    kind: Literal["llamacpp"] = "llamacpp"
    model: str = Field(DEFAULT_MODEL, description=f"A registered model ({', '.join(MODELS)}) or a path to a .gguf file.")
    n_ctx: int = Field(2048, gt=0, description="Context window in tokens (prompt + reasoning + answer).")
    n_threads: int | None = Field(None, gt=0, description="CPU threads per model; default: the actor's num_cpus (at least 1).")
    n_batch: int = Field(512, gt=0, description="Prompt tokens evaluated per llama.cpp batch.")
    top_k: int = Field(40, ge=0, description="Top-k sampling (0 = off).")
    min_p: float = Field(0.05, ge=0, le=1, description="Min-p sampling.")
    repeat_penalty: float = Field(1.1, gt=0, description="Penalty on repeated tokens (1 = off); keeps small base models from looping.")
    stop: tuple[str, ...] = Field(("\n\n",), description="Stop sequences of free-text (reasoning) requests.")

    @property
    def model_name(self) -> str:
        return self.model if self.model in MODELS else Path(self.model).name


def quiet() -> Any:
    """A context that silences what llama.cpp's C code prints while a model loads (unless
    ``KEYNES_VERBOSE=1``): ``verbose=False`` still lets lines such as ``llama_kv_cache_iswa:
    using full-size SWA cache`` through, once from every actor. Load errors still raise."""
    import os

    from llama_cpp._utils import suppress_stdout_stderr

    return suppress_stdout_stderr(disable=os.environ.get("KEYNES_VERBOSE") == "1")


class LlamaCppEngine:
    """Completes requests one by one on a llama-cpp-python model, seeded per request."""

    kind = "llamacpp"

    def __init__(self, spec: LlamaCppSpec):
        from llama_cpp import Llama

        self.spec = spec
        self.model = spec.model_name
        self.path = gguf_path(spec.model)
        threads = spec.n_threads or max(1, int(spec.num_cpus))
        with quiet():
            self.llm = Llama(
                model_path=str(self.path),
                n_ctx=spec.n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=spec.n_batch,
                seed=0,
                verbose=False,
            )
        self._grammars: dict[Constraint, object] = {}

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete every request; constrained ones return only the number's text."""
        grammar = self._grammar(batch.constraint) if batch.constraint is not None else None
        requests = list(batch)
        # Sorted prompts put shared prefixes next to each other: llama.cpp keeps the KV cache
        # of the longest common prefix with the previous prompt, so each is evaluated once.
        order = sorted(range(len(requests)), key=lambda i: requests[i].prompt)
        # Start every batch from an empty cache: logits then depend only on the batch, not on
        # what this actor played before (a prefix evaluated in another split can differ in
        # the last bits and flip a sample), so a rerun reproduces every answer.
        self.llm.reset()
        rows: list[Completion | None] = [None] * len(requests)
        for i in order:
            rows[i] = self._complete(requests[i], grammar)
        return CompletionBatch.from_rows(rows)  # type: ignore[arg-type]

    def _complete(self, request: Request, grammar: object | None) -> Completion:
        sampling = request.sampling
        seed = request.seed if request.seed != _RANDOM_SEED else _RANDOM_SEED - 1
        start = time.perf_counter()
        try:
            out = self.llm.create_completion(
                request.prompt,
                max_tokens=sampling.max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=self.spec.top_k,
                min_p=self.spec.min_p,
                repeat_penalty=self.spec.repeat_penalty,
                seed=seed,
                grammar=grammar,
                stop=list(self.spec.stop) if grammar is None else [],
            )
        except Exception as exc:  # e.g. a prompt longer than the context: this agent only
            return Completion("", latency_s=time.perf_counter() - start, error=f"llama.cpp: {type(exc).__name__}: {exc}")
        latency = time.perf_counter() - start
        text = out["choices"][0]["text"]
        usage = out.get("usage") or {}
        return Completion(
            text=text.strip() if grammar is not None else text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_s=latency,
        )

    def _grammar(self, constraint: Constraint) -> object:
        if constraint not in self._grammars:
            from llama_cpp import LlamaGrammar

            text = number_gbnf(constraint.low, constraint.high, constraint.integer)
            self._grammars[constraint] = LlamaGrammar.from_string(text, verbose=False)
        return self._grammars[constraint]

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()


register("llamacpp", LlamaCppSpec, LlamaCppEngine)
