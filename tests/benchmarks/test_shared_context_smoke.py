"""benchmarks/shared_context.py at a few agents, every section: (a) and (c) in the benchmark's
process on Gemma 3 270M (llama.cpp), (b), (d) and (e) through ``keynes run`` with one actor, joining
the session's Ray and Prefect API (``--ray-address``), so no run pays their start."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.smoke import NUMBER, figures, rate_of_printed, ratio_of_printed, run_benchmark

pytestmark = [pytest.mark.llm, pytest.mark.slow]

ROW = rf"\s+(\d+) answers\s+({NUMBER}) s\s+({NUMBER}) answers/s\s+({NUMBER}) ms CPU/answer"


def rows(out: str, label: str) -> tuple[float, ...]:
    answers, wall, rate, cpu = figures(re.escape(label) + ROW, out)
    assert wall > 0 and cpu > 0, out
    assert rate_of_printed(rate, answers, wall, rate_half=0.05), out  # both printed to 0.1
    return answers, wall


def test_sections_a_and_c_print_both_paths_and_their_ratios():
    out = run_benchmark("shared_context.py", "--sections", "a,c", "--agents", "4", "--per-agent", "2",
                        "--cot-agents", "2", "--threads", "1", timeout=900)
    a, c = out.split("(a) round 1")[1].split("(c) chain of thought")
    assert rows(a, "per-agent path")[0] == 2 and rows(a, "shared-context path")[0] == 4
    (ratio,) = figures(rf"ratio shared / per-agent: ({NUMBER})x answers/s", a)
    (_, w1), (_, w2) = rows(a, "per-agent path"), rows(a, "shared-context path")
    # (4 / w2) / (2 / w1), from walls printed to 0.1 s; the ratio has 2 decimals below 10, none above.
    half = 0.005 if ratio < 10 else 0.5
    assert ratio > 0 and 2 * (w1 - 0.05) / (w2 + 0.05) - half <= ratio <= 2 * (w1 + 0.05) / max(w2 - 0.05, 1e-9) + half, a
    for label in ("per-agent path", "shared, sequences 8 (default)", "shared, sequences 32"):
        assert rows(c, label)[0] == 2
    eight, thirty_two = figures(rf"ratio: ({NUMBER})x decisions/s \(sequences 8\), ({NUMBER})x \(sequences 32\)", c)
    assert eight > 0 and thirty_two > 0


def test_sections_b_d_and_e_run_keynes_and_store_every_guess(session_cli):
    env, ray_address = session_cli
    # Agents are not told their own guesses (--set reaches every keynes run): a round-2 prompt is its
    # persona's and arm's, as in round 1.
    out = run_benchmark("shared_context.py", "--sections", "b,d,e", "--agents", "4", "--per-agent", "2", "--rounds", "2",
                        "--actors", "1", "--ray-address", ray_address, "--set", "game.history.own_guesses=false",
                        timeout=900, env=env)
    b, rest = out.split("(b) 3 rounds")[1].split("(d) round 1")
    d, e = rest.split("(e) the paper's five-round game")
    # (b) 3 rounds of 2 agents per agent, then 3 rounds of 4 agents shared; (d) 1 round of 4.
    stored = [tuple(map(int, g)) for g in re.findall(r"guesses stored: (\d+) \((\d+) valid\)", b)]
    assert stored == [(6, 6), (12, 12)], b
    w1, r1, c1, w2, r2, c2, ratio = figures(
        rf"per-agent 6 decisions ({NUMBER}) s = ({NUMBER})/s \(({NUMBER}) CPU s\); "
        rf"shared 12 decisions ({NUMBER}) s = ({NUMBER})/s \(({NUMBER}) CPU s\); ratio ({NUMBER})x", b)
    assert min(w1, r1, c1, w2, r2, c2, ratio) > 0, b
    assert ratio_of_printed(ratio, r2, r1, half_step=0.05), b  # rates printed to 0.01, the ratio to 0.1
    assert "joins the running Ray" in d and re.search(r"guesses stored: 4 \(4 valid\)", d), d
    wall, rate, peak, cpu = figures(rf"wall ({NUMBER}) s, ({NUMBER}) decisions/s, peak memory ({NUMBER}) GiB \(every process\), ({NUMBER}) CPU s", d)
    assert wall > 0 and peak > 0 and cpu > 0 and rate_of_printed(rate, 4, wall, rate_half=0.5), d  # wall to 0.1 s, rate to 1/s

    # (e) 2 rounds of the five-round config's 2 arms: 2 agents per agent, then 4 shared
    stored = [tuple(map(int, g)) for g in re.findall(r"guesses stored: (\d+) \((\d+) valid\)", e)]
    assert stored == [(8, 8), (16, 16)], e
    r1, r2, ratio = figures(rf"per-agent 8 decisions {NUMBER} s = ({NUMBER})/s \({NUMBER} CPU s\); "
                            rf"shared 16 decisions {NUMBER} s = ({NUMBER})/s \({NUMBER} CPU s\); ratio ({NUMBER})x", e)
    assert ratio_of_printed(ratio, r2, r1, half_step=0.05), e
    table = re.findall(rf"round (\d): +(\d+) +(\d+) +({NUMBER}) +({NUMBER}) +({NUMBER})x", e)
    assert [(int(r), int(n)) for r, n, *_ in table] == [(1, 8), (2, 8)], e
    for _, n, prompts, evaluated, bound, over in table:
        # distinct prompts among the round's decisions; every decision cost tokens, never fewer than the bound
        assert 1 <= int(prompts) <= int(n) and float(evaluated) >= float(bound) > 0, e
        assert abs(float(over) - float(evaluated) / float(bound)) < 0.02, e  # all printed to 0.01
    assert e.splitlines()[0].endswith("2 per agent, --set game.history.own_guesses=false"), e
    # the ratio at the trie bound: the run's CPU a decision (printed above) scaled by bound / evaluated
    c1, c2 = figures(rf"per-agent 8 decisions {NUMBER} s = {NUMBER}/s \(({NUMBER}) CPU s\); "
                     rf"shared 16 decisions {NUMBER} s = {NUMBER}/s \(({NUMBER}) CPU s\)", e)
    share, at_bound, per_agent, ceiling = figures(
        rf"at the trie bound \(({NUMBER}) of the tokens evaluated\): ({NUMBER}) ms CPU a decision against the per-agent path's "
        rf"({NUMBER}) ms, a ratio of at most ({NUMBER})x", e)
    tokens = [(float(evaluated) * int(n), float(bound) * int(n)) for _, n, _, evaluated, bound, _ in table]
    assert 0 < share <= 1 and abs(share - sum(b for _, b in tokens) / sum(t for t, _ in tokens)) < 0.02, e
    # CPU s printed to 1, ms to 0.1
    assert abs(per_agent - c1 / 8 * 1000) <= 0.5 / 8 * 1000 + 0.05, e
    assert at_bound <= (c2 + 0.5) / 16 * 1000 + 0.05, e
    assert ratio_of_printed(ceiling, per_agent, at_bound, half_step=0.05), e
    assert table[1][2] == table[0][2], e  # no agent's own guess in round 2's prompts: as many as round 1's
