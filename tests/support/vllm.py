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

vLLM's OpenAI server (``VllmServer``, fixture ``vllm_server``) is the other way a test runs vLLM: the
session starts it once, on Gemma, with the flags the openai engine's exact path needs. It takes the
same slot as the in-process engine: starting it closes the engine, loading an engine stops it, so
one vLLM is loaded at a time on the 2-core machine (tests/conftest.py orders the group's modules so
that each loads once).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.waiting import answers, free_port, wait_for


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
            self.server = VllmServer(free_port(), log)
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

#: The served model's name (``--served-model-name``): the bundled name, so the openai engine's
#: default tokenizer (its model) is the same prepared folder.
SERVED = "gemma-3-270m"


#: For the hosted preset's chat completions (tests/engines/test_openai_hosted.py): Gemma's turn format
#: as a chat template (the bundled GGUF, a base model, holds none), and JSON answers without free
#: whitespace (``response_format``: the base model fills a JSON object's whitespace until max_tokens).
STRUCTURED_OUTPUTS = '{"backend": "xgrammar", "disable_any_whitespace": true}'
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                 "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` of the bundled Gemma on 127.0.0.1, sized for
    the tests like the in-process engine (``SPECS``: 512 tokens, 0.5 GiB KV cache, the same dtype and
    scheduling), with the exact path's flags (``engines.openai.exact.FLAGS``), a chat template and
    compact JSON (``CHAT_TEMPLATE``, ``STRUCTURED_OUTPUTS``). The ``vllm`` command of the vllm-cpu distribution does not start (no package
    metadata for "vllm"), hence the module."""

    def __init__(self, port: int, log: Path, extra: tuple[str, ...] = ()):
        self.port, self.log, self.extra = port, log, extra
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        from engines.vllm import VllmSpec
        from engines.vllm.convert import vllm_model

        spec = VllmSpec(model=SERVED, **SPECS[SERVED])
        kwargs = spec.llm_kwargs(str(vllm_model(SERVED)))
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kwargs["model"], "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(kwargs["max_model_len"]),
            "--dtype", kwargs["dtype"], "--enforce-eager", "--seed", str(kwargs["seed"]), "--max-num-seqs", "8",
            "--kv-cache-memory-bytes", str(kwargs["kv_cache_memory_bytes"]), "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(kwargs["max_num_batched_tokens"]),
            "--logprobs-mode", kwargs["logprobs_mode"], "--max-logprobs", str(kwargs["max_logprobs"]),
            "--api-key", os.environ[VLLM_KEY_ENV], "--chat-template", CHAT_TEMPLATE,
            "--structured-outputs-config", STRUCTURED_OUTPUTS, *self.extra,
        ]

    def start(self, timeout_s: float = 900) -> None:
        """Launch and wait until ``/health`` answers (minutes on a busy AVX2-only CPU)."""
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.process.returncode}: {self.logs()[-3000:]}")
            return answers(f"http://127.0.0.1:{self.port}/health", timeout_s=2)

        try:
            wait_for(ready, timeout_s, f"vLLM's server (its log: {self.log})", interval_s=1)
        except AssertionError:
            self.stop()
            raise

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """SIGTERM to the server's process group (its engine core too), SIGKILL if it lingers."""
        from tests.support.processes import stop_group

        stop_group(self.process)
