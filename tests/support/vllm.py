"""The session's in-process vLLM engine: loaded once per model, one alive at a time.

vLLM's engine start is the costliest thing the vLLM tests do (tens of seconds on an AVX-512 Xeon,
minutes on an AVX2-only CPU), so every module that runs vLLM in the test process takes its engine
from here (fixture ``vllm_engine`` in tests/conftest.py): Gemma's for tests/engines/test_vllm.py
and tests/benchmarks/test_vllm_throughput_smoke.py, SmolLM2's for tests/engines/test_vllm_chat.py.
Only one is alive at a time: an in-process engine kept alive while another was built and closed
answered empty texts afterwards (seen in a full run, seed 1234), so asking for another model
closes the current one first; tests/conftest.py runs SmolLM2's module after Gemma's so that each
model loads once. The round through Ray (experiments/vllm_cpu.yaml) loads its own engine in its
actor's process: nothing loaded here can cross into it.
"""

from __future__ import annotations

import gc
import time
from typing import Any

#: Each model's engine, sized for the tests: prompts of at most a few hundred tokens, a few
#: hundred requests at once. The dtype is the spec's default (float32 on a CPU without bfloat16
#: instructions, docs/vllm.md).
SPECS: dict[str, dict[str, Any]] = {
    "gemma-3-270m": {"max_model_len": 512, "kv_cache_gib": 0.5},
    "smollm2-135m-instruct": {"max_model_len": 1024, "kv_cache_gib": 0.5},
}


class VllmEngines:
    """Hands out the session's engine for a model (``SPECS``), loading it on first use."""

    def __init__(self) -> None:
        self.current: Any = None
        #: (model, load seconds) of every engine loaded, in order: one per model in a session.
        self.loads: list[tuple[str, float]] = []

    def __call__(self, model: str) -> Any:
        from engines.vllm import VllmEngine, VllmSpec

        if self.current is not None and self.current.spec.model == model:
            return self.current
        self.close()
        start = time.perf_counter()
        self.current = VllmEngine(VllmSpec(model=model, **SPECS[model]))
        self.loads.append((model, time.perf_counter() - start))
        return self.current

    def close(self) -> None:
        """Close the current engine and free it before another is built."""
        if self.current is not None:
            self.current.close()
            self.current = None
            gc.collect()
