"""The llama.cpp engine: a GGUF model on CPU through llama-cpp-python, the laptop default.

``engine`` is the engine and its spec; the exact paths live beside it: ``shared_context``
(answer-tree logits from the prompt's KV state), ``batch`` (many agents' free text in one
context), ``blocks`` (block-aligned prompt evaluation), ``head`` (only the output rows an
answer reads) and ``internals`` (every use of llama-cpp-python's private members, in one
tested place). Nothing outside this package imports those modules; ``gguf_tokens`` (a GGUF's
answer tokens, for a server of that file) is exported here.
"""

from __future__ import annotations

from engines.llamacpp.engine import LlamaCppEngine, LlamaCppSpec
from engines.llamacpp.shared_context import gguf_tokens

__all__ = ["LlamaCppEngine", "LlamaCppSpec", "gguf_tokens"]
