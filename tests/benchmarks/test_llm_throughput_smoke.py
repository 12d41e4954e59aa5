"""benchmarks/llm_throughput.py at 2 prompts, both sections: keynes' llama.cpp engine against a
plain llama-cpp-python loop (Gemma 3 270M), and the vLLM section on vLLM's CPU backend."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark

pytestmark = [pytest.mark.llm, pytest.mark.vllm, pytest.mark.slow]


def test_each_section_prints_both_rates_and_their_ratio():
    out = run_benchmark("llm_throughput.py", "--engines", "llamacpp,vllm", "--prompts", "2", "--threads", "1", timeout=900)
    assert "2 prompts (basic mode" in out and "threads=1" in out, out
    llamacpp, vllm = out.split("\n[llamacpp]\n")[1].split("\n[vllm]\n")
    keynes_valid, plain_valid = figures(r"keynes answers valid: (\d+)/2; plain answers valid: (\d+)/2", llamacpp)
    assert keynes_valid == 2 and plain_valid == 2  # both constrained by the same grammar
    for section, (base, ours) in ((llamacpp, ("plain llama-cpp-python loop", "keynes llamacpp engine")),
                                  (vllm, ("plain LLM.generate", "keynes vllm engine"))):
        rates = []
        for label in (base, ours):
            rate, run = figures(rf"{re.escape(label)}\s+({NUMBER}) answers/s\s+\(runs: ({NUMBER}) s;", section)
            assert run > 0 and ratio_of_printed(rate, 2, run, half_step=0.05), section  # 2 answers in one run
            rates.append(rate)
        (ratio,) = figures(rf"ratio keynes / plain: ({NUMBER})\s+\(goal >= 0\.9\)", section)
        assert ratio > 0 and ratio_of_printed(ratio, rates[1], rates[0]), section
