"""benchmarks/cold_start.py at a tiny size (200 agents, one shard per run): both runs complete and
their printed timelines add up. A cold start for real: no PREFECT_API_URL and no Ray address, so
each `keynes run` starts its own temporary Prefect API and local Ray, on a PREFECT_HOME holding a
migrated database (as after a user's first run: the migration itself is not what is measured)."""

from __future__ import annotations

import os
import re

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark

POINTS = ("header printed", "experiment row created", "run row created", "first shard committed", "last shard committed", "process exit")


@pytest.fixture(scope="module")
def printed(tmp_path_factory) -> str:
    from tests.support.prefect_db import seed_home

    home = seed_home(tmp_path_factory.mktemp("prefect"), tmp_path_factory)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    out = run_benchmark("cold_start.py", "--agents", "200", "--prefect-home", str(home), timeout=600, env=env)
    print(out)
    return out


@pytest.mark.slow
@pytest.mark.llm
def test_the_timelines_are_in_order_and_the_ratio_is_of_the_walls(printed):
    out = printed
    assert re.search(r"^run 1 of 1 \(load average [\d.]+ on \d+ cores\):$", out, re.MULTILINE), out
    gemma, simulated = {}, {}
    for point in POINTS:
        gemma[point], simulated[point] = figures(rf"^  {point}\s+({NUMBER})\s+({NUMBER})$", out)
    for timeline in (gemma, simulated):
        moments = [timeline[p] for p in POINTS]
        assert 0 < moments[0] and moments == sorted(moments), (timeline, out)
    # One shard of 200 agents: the first shard is the last
    assert gemma["first shard committed"] == gemma["last shard committed"], out
    top, bottom, ratio = figures(rf"^  wall: gemma ({NUMBER}) s, simulated ({NUMBER}) s: gemma/simulated ({NUMBER})x$", out)
    assert (top, bottom) == (gemma["process exit"], simulated["process exit"]) and ratio_of_printed(ratio, top, bottom), out


@pytest.mark.slow
@pytest.mark.llm
def test_prefect_s_api_and_the_actors_start_before_the_flow(printed):
    """KEYNES_TIMINGS=1's phases: the temporary API starts after the header, and it answers and Ray
    is up before the flow starts; each actor's phases (those Ray forwarded) come in their order. Gemma's
    actor answers round 1's prompts ahead of its first shard (tasks.play.answer_ahead); the
    simulated engine keeps no distributions, so it is handed none."""
    for engine in ("gemma", "simulated"):
        block = re.search(rf"^  phases of {engine} \(KEYNES_TIMINGS=1\), seconds after the command starts:\n((?:    .*\n?)+)", printed, re.MULTILINE)
        assert block, printed
        phases = {phase: float(seconds) for seconds, phase in re.findall(r"^\s+([\d.]+)  (.+)$", block.group(1), re.MULTILINE)}
        assert phases["cli: header"] <= phases["api: starting"] <= phases["api: answering"] <= phases["flow: started"], (engine, phases)
        assert phases["ray: starting"] <= phases["ray: started"] <= phases["flow: started"] <= phases["flow: run rows"], (engine, phases)
        actors = {name.split(":")[0] for name in phases if name.startswith("actor ")}
        assert actors, (engine, phases)
        ahead = ("answering ahead", "answered ahead") if engine == "gemma" else ()
        for actor in actors:
            steps = ("started", "engine built", *ahead, "first shard started", "first shard played")
            # Every actor plays (no more actors than shards): each of its phases is there, then in order.
            assert [p for p in steps if f"{actor}: {p}" not in phases] == [], (engine, actor, phases)
            moments = [phases[f"{actor}: {p}"] for p in steps]
            assert moments == sorted(moments), (engine, actor, phases)
        handed = [name for name in phases if "handed ahead" in name or "ahead" in name.split(": ")[-1]]
        if engine == "gemma":
            assert phases["flow: personas"] <= phases["flow: round 1's prompts handed ahead"] <= phases["flow: run rows"], phases
            assert any(f"{actor}: answered ahead" in phases for actor in actors), phases
        else:
            assert handed == [], phases


@pytest.mark.quick
def test_the_median_ratio_of_repeated_runs_is_of_each_run_s_walls():
    """``--repeat N`` ends with each run's walls' ratio and their median (``ratio_summary``),
    computed here on made-up timelines in the benchmark's own code."""
    import subprocess
    import sys

    from tests.conftest import REPO

    probe = """
import sys
sys.path.insert(0, "benchmarks")
from cold_start import ratio_summary
run = lambda gemma, simulated: {"gemma": {"process exit": gemma}, "simulated": {"process exit": simulated}}
print(ratio_summary([run(11.0, 10.0), run(13.2, 11.0), run(9.0, 10.0), run(12.0, 12.0)]))
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    # ratios 1.1, 1.2, 0.9, 1.0: median 1.05; walls' medians 11.5 and 10.5 (not their ratio, 1.095)
    assert result.stdout.strip() == ("gemma/simulated per run: 1.10, 1.20, 0.90, 1.00x; median 1.05x "
                                     "(median walls: gemma 11.50 s, simulated 10.50 s)"), result.stdout
