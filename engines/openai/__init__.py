"""The openai engine: any OpenAI-compatible server (vLLM, llama.cpp, a hosted API) over HTTP.

``engine``: the spec, the per-agent path and the n path (retries, rate limits); ``endpoint``:
the key header and the ``/models`` check;
``presets``: the ``server:`` presets (what each kind of server takes); ``exact``: exact answer
distributions over HTTP from vLLM's server (``shared_context``), checked against the server at
start. Nothing here imports a model library.
"""

from __future__ import annotations

from engines import register
from engines.openai.engine import OpenAIEngine, OpenAISpec
from engines.openai.presets import PRESETS

__all__ = ["OpenAIEngine", "OpenAISpec", "PRESETS"]

register("openai", OpenAISpec, OpenAIEngine)
