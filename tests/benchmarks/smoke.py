"""Running a shipped benchmark as users do (a subprocess from the repository root) and reading
the figures it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO

NUMBER = r"[\d,]+(?:\.\d+)?"


def run_benchmark(script: str, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> str:
    """``python benchmarks/<script> args…``; fails with its output unless it exits 0; its stdout."""
    result = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=REPO, env=env or dict(os.environ),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + readable(result.stderr)[-3000:]
    return result.stdout


def readable(stderr: str) -> str:
    """``stderr`` less the lines nanobind prints at the exit of every process that imported vLLM's
    triton ("leaked type ...", hundreds of them), which would push the error out of the tail."""
    return "\n".join(line for line in stderr.splitlines()
                     if not ("leaked " in line or line.startswith("nanobind:") or "skipped remainder" in line))


def figures(pattern: str, text: str) -> list[float]:
    """The numbers captured by ``pattern``'s groups in the first line that matches it."""
    match = re.search(pattern, text, re.MULTILINE)
    assert match, f"no line matches {pattern!r} in:\n{text}"
    return [float(g.replace(",", "")) for g in match.groups()]


def ratio_of_printed(ratio: float, top: float, bottom: float, half_step: float = 0.005) -> bool:
    """Whether a printed ratio is ``top / bottom`` of two printed figures, each rounded to the
    same ``half_step`` (0.005: two decimals) as the ratio."""
    low = (top - half_step) / (bottom + half_step) - half_step
    high = (top + half_step) / max(bottom - half_step, 1e-9) + half_step
    return low <= ratio <= high


def rate_of_printed(rate: float, count: float, wall: float, rate_half: float, wall_half: float = 0.05) -> bool:
    """Whether a printed rate is ``count / wall`` for a wall printed to ``wall_half`` (0.05: one
    decimal) and the rate printed to ``rate_half``: a wall of 1.04 s prints as 1.0 beside a rate
    of 1.9 for two answers."""
    low = count / (wall + wall_half) - rate_half
    high = count / max(wall - wall_half, 1e-9) + rate_half
    return low <= rate <= high
