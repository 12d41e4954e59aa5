"""The session's in-process vLLM engine: loaded once per model, one alive at a time.

vLLM's engine start is the costliest thing the vLLM tests do (tens of seconds on an AVX-512 Xeon,
minutes on an AVX2-only CPU), so every module that runs vLLM in the test process takes its engine
from here (fixture ``vllm_engine`` in tests/conftest.py): Gemma's for tests/engines/test_vllm.py
and tests/benchmarks/test_vllm_throughput_smoke.py, SmolLM2's for tests/engines/test_vllm_chat.py.
Only one is alive at a time: an in-process engine kept alive while another is built and closed
answers empty texts afterwards (seen in a full run, seed 1234), so asking for another model
closes the current one first; tests/conftest.py runs SmolLM2's module after Gemma's so that each
model loads once. The round through Ray (experiments/vllm_cpu.yaml) loads its own engine in its
actor's process: nothing loaded here can cross into it.

vLLM's OpenAI server (benchmarks/servers.py's ``VllmServer``, fixture ``vllm_server``) is the other way
a test runs vLLM: the session starts it once, on Gemma, with the flags the openai engine's exact path
needs and the key in ``VLLM_KEY_ENV``. It takes the same slot as the in-process engine: starting it
closes the engine, loading an engine stops it, so one vLLM is loaded at a time on the 2-core machine
(tests/conftest.py orders the group's modules so that each loads once).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from benchmarks.servers import SERVED, VLLM_SIZE, VllmServer, free_port

#: Each model's engine, sized for the tests as the served model (``VLLM_SIZE``): prompts of at most a
#: few hundred tokens, a few hundred requests at once.
SPECS: dict[str, dict[str, Any]] = {
    SERVED: VLLM_SIZE,
    "smollm2-135m-instruct": {"max_model_len": 1024, "kv_cache_gib": 0.5},
}


class VllmEngines:
    """Hands out the session's engine for a model (``SPECS``), loading it on first use."""

    def __init__(self) -> None:
        self.current: Any = None
        #: (model, load seconds) of every engine loaded, in order: one per model in a session.
        self.loads: list[tuple[str, float]] = []
        #: The session's vLLM server while it runs (``serve``), and every start's seconds.
        self.server: VllmServer | None = None
        self.server_starts: list[float] = []

    def __call__(self, model: str) -> Any:
        from engines.vllm import VllmEngine, VllmSpec

        if self.current is not None and self.current.spec.model == model:
            return self.current
        self.close()
        self.stop_server()
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

    def serve(self, log: Path) -> VllmServer:
        """The session's vLLM server of Gemma, started on first use (the in-process engine closed first)."""
        if self.server is None:
            self.close()
            start = time.perf_counter()
            self.server = VllmServer(free_port(), log, VLLM_KEY_ENV)
            self.server.start()
            self.server_starts.append(time.perf_counter() - start)
        return self.server

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


#: The variable holding the session server's API key, set for the whole session (tests/conftest.py)
#: before any Ray starts, so that the actors of a flow read it too.
VLLM_KEY_ENV = "KEYNES_TEST_VLLM_API_KEY"
