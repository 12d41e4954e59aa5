"""benchmarks/vllm_throughput.py at its smallest size on vLLM's CPU backend: 2 prompts, one run
of each side (its default is 200 prompts, 3 runs each)."""

from __future__ import annotations

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_vllm_benchmark_prints_both_rates_and_their_ratio():
    out = run_benchmark("vllm_throughput.py", "--prompts", "2", "--repeat", "1", timeout=900)
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
