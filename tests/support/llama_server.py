"""llama.cpp's own server, ``llama-server``, for the tests of ``server: llamacpp``'s exact path.

The binary is the one ``.ci/llama-server`` builds into ``.cache/llama-server/bin`` (or
``$KEYNES_LLAMA_SERVER``); tests that need it are marked ``needs("llama-server", ...)``. One
``LlamaCppServer`` serves one GGUF under an alias on 127.0.0.1; ``restart`` serves another file on
the same port (a served model's revision changing behind the same name).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.processes import stop_group
from tests.support.waiting import answers, free_port, port_is_free, wait_for

REPO = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("KEYNES_LLAMA_SERVER") or REPO / ".cache" / "llama-server" / "bin" / "llama-server")
HOW = "bash .ci/llama-server"


def built() -> bool:
    """Whether the llama-server binary is there."""
    return BINARY.is_file() and os.access(BINARY, os.X_OK)


class LlamaCppServer:
    """``llama-server`` serving ``model`` as ``alias``: one slot, the context the in-process engine
    gets (2,048 tokens), two threads."""

    def __init__(self, model: Path, alias: str, log: Path, port: int | None = None):
        self.model, self.alias, self.log = model, alias, log
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [str(BINARY), "--model", str(self.model), "--alias", self.alias, "--host", "127.0.0.1", "--port", str(self.port),
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
