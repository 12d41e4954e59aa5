"""The chaos benchmark at a small size, as users run it (no timing assertions): 1,000 simulated
agents × 2 rounds × 2 arms, shards of 100, interrupted twice: SIGKILL of a Ray actor (the run goes
on: Ray restarts it) and SIGKILL of `keynes run` itself (the same command is rerun), in the order
seed 0 draws. Each kind of kill has its own test: tests/flows/test_temporary_api.py
(Prefect's temporary API killed, Ctrl-C), tests/flows/test_sigterm.py, tests/reliability/ (SIGKILL
of the run, of an actor, of a node). Every run uses the session's Prefect API and starts its own
local Ray (a killed actor must be the run's own)."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.smoke import figures, run_benchmark

KINDS = ("run-sigkill", "actor-sigkill")


@pytest.fixture(scope="module")
def chaos(tmp_path_factory, session_cli):
    env, _ = session_cli  # the session's Prefect API; no Ray address: each run its own local Ray
    work = tmp_path_factory.mktemp("chaos")
    env = dict(env, KEYNES_CACHE=str(work / "cache"))
    out = run_benchmark("chaos.py", "--agents", "1000", "--rounds", "2", "--shard-size", "100", "--latency", "0.1",
                        "--kills", "2", "--kinds", ",".join(KINDS), "--seed", "0", "--workdir", str(work / "runs"),
                        timeout=600, env=env)
    print(out)
    return out


@pytest.mark.slow
def test_the_interrupted_warehouse_is_the_uninterrupted_one(chaos):
    out = chaos
    ref = re.search(r"content hash, uninterrupted: ([0-9a-f]{64})", out).group(1)
    got = re.search(r"content hash, interrupted: +([0-9a-f]{64})", out).group(1)
    assert ref == got and "identical: yes" in out, out
    assert figures(r"rows lost: ([\d,]+); rows extra: ([\d,]+); rows duplicated: ([\d,]+) \(uninterrupted: ([\d,]+)\)", out) == [0, 0, 0, 0]
    # every results table was compared, with every guess in it
    rows = dict(re.findall(r"^  (\w+) +([\d,]+) rows reference +[\d,]+ rows interrupted$", out, re.MULTILINE))
    assert rows["guesses"] == "4,000" and rows["rounds"] == "4" and rows["personas"] == "1,000", out
    assert {"shards", "winners", "tau_fits", "paired_tests", "runs", "experiments", "answer_distributions"} <= set(rows)


@pytest.mark.slow
def test_both_kills_struck_and_nothing_was_orphaned(chaos):
    out = chaos
    line = re.search(r"^kills: (\d+) of 2 \(([^)]*)\); runs: (\d+); completed before their kill: (\d+)$", out, re.MULTILINE)
    struck = {kind: int(n) for kind, n in re.findall(r"(\S+) (\d+)", line.group(2))}
    # The actor's kill leaves the run going; the run's own ends it, and one rerun completes
    assert struck == {"run-sigkill": 1, "actor-sigkill": 1} and line.group(1) == "2", out
    assert line.group(3) == "2" and line.group(4) == "0", out
    assert re.search(r"run \d: actor-sigkill at [\d.]+ s; the run goes on", out), out
    orphans, seen, _ = figures(r"orphans: (\d+) \(processes carrying the run's tag seen: (\d+); ended by the next start's cleanup: (\d+)\)", out)
    # the tag was found on the runs' processes, so that none is left running is a real check
    assert orphans == 0 and seen > 0, out
    assert "problem:" not in out, out
