"""benchmarks/warm_start.py at a tiny size (200 simulated agents, one shard per run): `keynes up`,
a cold run (its own Ray and temporary Prefect API), two runs joined to the stack (each checked by
the benchmark to say so), `keynes down`; the printed timelines are in order and the ratios are
of the printed walls. Its own cache (the stack's record) and a migrated PREFECT_HOME."""

from __future__ import annotations

import os
import re

import pytest

from cli.runtime.processes import TAG
from cli.runtime.stack import OFF, STACK_TAG, marked
from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark

POINTS = ("header printed", "experiment row created", "run row created", "first shard committed", "last shard committed", "process exit")


@pytest.mark.slow
def test_cold_and_warm_runs_side_by_side(tmp_path, prefect_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k not in ("RAY_ADDRESS", TAG, STACK_TAG, OFF)}
    env.update(KEYNES_CACHE=str(tmp_path / "cache"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    try:
        out = run_benchmark("warm_start.py", "--agents", "200", "--shard-size", "200", "--engine", "simulated",
                            "--prefect-home", str(prefect_home), timeout=900, env=env)
    finally:
        left = marked(str(tmp_path / "cache"))
        for proc in left:
            proc.kill()
    print(out)
    assert not left, "the benchmark's keynes down left processes of the stack"
    assert re.search(r"^keynes up: [\d.]+ s \(once, untimed below\)$", out, re.MULTILINE), out
    assert re.search(r"^keynes down: [\d.]+ s$", out, re.MULTILINE) and "  | warm stack down" in out, out
    assert re.search(r"^repeat 1 of 1 \(load average [\d.]+ on \d+ cores\):$", out, re.MULTILINE), out
    timelines = {"cold": {}, "warm": {}, "again": {}}
    for point in POINTS:
        cold, warm, again = figures(rf"^  {point}\s+({NUMBER})\s+({NUMBER})\s+({NUMBER})$", out)
        timelines["cold"][point], timelines["warm"][point], timelines["again"][point] = cold, warm, again
    for timeline in timelines.values():
        moments = [timeline[p] for p in POINTS]
        assert 0 < moments[0] and moments == sorted(moments), (timeline, out)
    for kind in ("warm", "again"):
        wall, cold, ratio = figures(rf"^  wall: {kind} ({NUMBER}) s, cold ({NUMBER}) s: {kind}/cold ({NUMBER});", out)
        assert (wall, cold) == (timelines[kind]["process exit"], timelines["cold"]["process exit"]), out
        assert ratio_of_printed(ratio, wall, cold), out
    # The warm runs joined the stack's Ray: no local Ray of their own started (ensure_ray marks
    # the join too), and the second found the actor the first had started.
    for kind, kept in (("warm", "(kept warm)"), ("again", "(kept warm)")):
        block = re.search(rf"^  phases of {kind} \(KEYNES_TIMINGS=1\), seconds after the command starts:\n((?:    .*\n?)+)", out, re.MULTILINE)
        assert block and f"pool: 1 actor(s) requested {kept}" in block.group(1), out
    again = re.search(r"^  phases of again .*\n((?:    .*\n?)+)", out, re.MULTILINE).group(1)
    assert "actor 1: started" not in again, "the second warm run started an actor of its own"
