"""benchmarks/decode_shapes.py at a few shapes: what a token of the five-round game's round-5 prompt
costs on Gemma 3 270M (llama.cpp), by the decode that evaluates it."""

from __future__ import annotations

import pytest

from tests.benchmarks.smoke import NUMBER, figures, run_benchmark

pytestmark = [pytest.mark.llm, pytest.mark.slow]


def test_every_shape_prints_its_cost_and_the_fewest_is_theirs():
    out = run_benchmark("decode_shapes.py", "--repeat", "1", "--blocks", "16,64", "--streams", "2", "--nodes", "1,2", timeout=600)
    (tokens,) = figures(r"a round-5 prompt of (\d+) tokens; the best of 1 runs", out)
    assert 150 < tokens < 400, out  # the rules, four rounds told with the agent's guesses, a persona, the cue
    prompt = [figures(rf"prompt, 1 stream, blocks of +{b}: +({NUMBER}) ms/token", out)[0] for b in (16, 64)]
    prompt.append(figures(rf"prompt, +2 streams x 16 tokens a decode: +({NUMBER}) ms/token", out)[0])
    nodes = [figures(rf"answer-tree nodes, +{k} a decode: +({NUMBER}) ms a decode, +({NUMBER}) ms/node", out) for k in (1, 2)]
    assert min(prompt) > 0 and all(per > 0 and abs(decode - per * k) <= 0.05 + 0.005 * k for k, (decode, per) in zip((1, 2), nodes)), out
    fewest_token, fewest_node = figures(rf"fewest ms per prompt token: ({NUMBER}) \(.+\); per answer-tree node: ({NUMBER}) \(\d a decode\)", out)
    assert fewest_token == min(prompt) and fewest_node == min(per for _, per in nodes), out
