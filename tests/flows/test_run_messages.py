"""What `keynes run` says in the terminal: a `continue` experiment that is already complete
says so (instead of "0 round(s) played"), and a bad override is one line, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO


def keynes_run(config, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), KEYNES_CACHE=str(tmp_path / "cache"),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    return subprocess.run([sys.executable, "-m", "flows.cli", "run", str(config), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_complete_continue_experiment_says_so_in_the_terminal(tmp_path):
    config = tmp_path / "once.yaml"
    config.write_text(yaml.safe_dump({
        "name": "once", "seed": 1, "population": {"size": 10}, "game": {"rounds": 1},
        "workers": {"actors": 1, "shard_size": 10}, "report": {"enabled": False}, "continue": True,
        "db": str(tmp_path / "once.duckdb"),
    }))
    first = keynes_run(config, tmp_path)
    assert first.returncode == 0 and "done: 1 round(s) played, 10 guesses written" in first.stderr, first.stderr
    again = keynes_run(config, tmp_path)
    assert again.returncode == 0, again.stderr
    assert "is complete: all 1 round(s) of 1 arm(s) are in" in again.stderr and "nothing to play" in again.stderr
    assert "0 round(s) played" not in again.stderr
    bad = keynes_run(config, tmp_path, "--set", "population.size=-3")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["error: population.size: -3: input should be greater than 0"]
