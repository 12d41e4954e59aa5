"""The vLLM engine: offline ``vllm.LLM`` in the Ray actor that owns it, one GPU (or CPU) each.

``engine`` is the engine and its spec; ``shared_context`` computes answer-tree logits with one
``generate`` per tree level (its tokenizer helpers, ``token_texts`` and ``eog_ids``, serve the
openai engine's exact path too); ``convert`` turns a bundled GGUF into the Hugging Face folder vLLM
loads (``keynes models prepare``).
"""

from __future__ import annotations

from engines.vllm.convert import BUNDLED, is_prepared, timed_prepare, vllm_model
from engines.vllm.engine import VllmEngine, VllmSpec
from engines.vllm.shared_context import eog_ids, token_texts

__all__ = ["BUNDLED", "VllmEngine", "VllmSpec", "eog_ids", "is_prepared", "timed_prepare", "token_texts", "vllm_model"]
