"""What starting a run took, recorded by ``keynes run`` and added by ``keynes plan`` (cli/runtime/starts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli.runtime import starts
from tests.conftest import REPO


@pytest.mark.quick
def test_a_start_is_kept_per_way_and_engine_and_a_bad_file_reads_as_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KEYNES_CACHE", str(tmp_path))
    assert starts.recorded("cold", "llamacpp:gemma-3-270m") is None
    starts.record("cold", "llamacpp:gemma-3-270m", 18.234)
    starts.record("warm", "llamacpp:gemma-3-270m", 4.5)
    assert starts.recorded("cold", "llamacpp:gemma-3-270m") == 18.23
    assert starts.recorded("warm", "llamacpp:gemma-3-270m") == 4.5
    assert starts.recorded("cold", "simulated:simulated/uniform") is None
    starts.starts_path().write_text("[not a record")
    assert starts.recorded("cold", "llamacpp:gemma-3-270m") is None
    starts.record("cold", "llamacpp:gemma-3-270m", 3.0)  # a broken file is replaced, not a failure
    assert starts.recorded("cold", "llamacpp:gemma-3-270m") == 3.0


def test_keynes_plan_adds_the_start_the_last_run_recorded(tmp_path, session_cli):
    """A run of a tiny simulated experiment records its start (its wall less its rounds' seconds);
    the plan of the same config then counts it once, before its first arm, and its table says so."""
    env, ray_address = session_cli
    env = env | {"KEYNES_CACHE": str(tmp_path / "cache")}
    config = ["experiments/quickstart.yaml", "--set", "population.size=6", "--set", "game.rounds=1",
              "--set", "arms.prompts=[basic]", "--set", "arms.engines=[{kind: simulated, latency_s: 0.2}]",
              "--set", f"workers.ray_address={ray_address}", "--set", "report.enabled=false"]

    def keynes(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)

    before = keynes("plan", *config, "--format", "json")
    assert before.returncode == 0, before.stderr
    assert [r["start_seconds"] for r in json.loads(before.stdout)] == [None]  # nothing recorded yet
    ran = keynes("run", *config[:1], "--db", str(tmp_path / "k.duckdb"), *config[1:])
    assert ran.returncode == 0, ran.stderr[-3000:]
    recorded = json.loads((tmp_path / "cache" / "starts.json").read_text())
    assert list(recorded) == ["cluster|simulated:simulated/uniform"], recorded
    assert recorded["cluster|simulated:simulated/uniform"] > 0
    after = keynes("plan", *config, "--format", "json")
    assert [r["start_seconds"] for r in json.loads(after.stdout)] == [round(recorded["cluster|simulated:simulated/uniform"], 1)]
    table = keynes("plan", *config)
    printed = " ".join(table.stdout.split())  # lines fold at 80 columns
    assert "start: Ray, Prefect's API, the models and the run's bookkeeping, as the last cluster run of simulated:simulated/uniform" in printed, printed
    assert printed.count(" start ") == 1 and " all " in printed, printed  # one start row, in the total
