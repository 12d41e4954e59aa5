"""The llama.cpp engine: a GGUF model on CPU through llama-cpp-python, the laptop default.

``engine`` is the engine and its spec; the exact paths live beside it: ``shared_context``
(answer-tree logits from the prompt's KV state), ``batch`` (many agents' free text in one
context), ``blocks`` (block-aligned prompt evaluation), ``head`` (only the output rows an
answer reads) and ``internals`` (every use of llama-cpp-python's private members, in one
tested place). Nothing outside this package imports those modules.
"""

from __future__ import annotations

from engines.llamacpp.engine import LlamaCppEngine, LlamaCppSpec

__all__ = ["LlamaCppEngine", "LlamaCppSpec"]
