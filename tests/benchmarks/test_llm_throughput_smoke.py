"""benchmarks/llm_throughput.py at 2 prompts: keynes' llama.cpp engine against a plain
llama-cpp-python loop (Gemma 3 270M). Its vLLM section is ``vllm_throughput.bench_vllm``, which
tests/benchmarks/test_vllm_throughput_smoke.py runs (two more vLLM loads here would test
nothing more)."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark

pytestmark = [pytest.mark.llm, pytest.mark.slow]


def test_the_llamacpp_section_prints_both_rates_and_their_ratio():
    out = run_benchmark("llm_throughput.py", "--engines", "llamacpp", "--prompts", "2", "--threads", "1", timeout=900)
    assert "2 prompts (basic mode" in out and "threads=1" in out, out
    llamacpp = out.split("\n[llamacpp]\n")[1]
    assert "[vllm]" not in out
    keynes_valid, plain_valid = figures(r"keynes answers valid: (\d+)/2; plain answers valid: (\d+)/2", llamacpp)
    assert keynes_valid == 2 and plain_valid == 2  # both constrained by the same grammar
    rates = []
    for label in ("plain llama-cpp-python loop", "keynes llamacpp engine"):
        rate, run = figures(rf"{re.escape(label)}\s+({NUMBER}) answers/s\s+\(runs: ({NUMBER}) s;", llamacpp)
        assert run > 0 and ratio_of_printed(rate, 2, run, half_step=0.05), llamacpp  # 2 answers in one run
        rates.append(rate)
    (ratio,) = figures(rf"ratio keynes / plain: ({NUMBER})\s+\(goal >= 0\.9\)", llamacpp)
    assert ratio > 0 and ratio_of_printed(ratio, rates[1], rates[0]), llamacpp
