"""What `keynes run` says in the terminal: the experiment's name as written, a `continue`
experiment that is already complete says so (instead of "0 round(s) played"), a bad override is
one line, exit status 2, and so is
a temporary Prefect API that does not start in time."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO


def keynes_run(config, tmp_path, *args: str, startup_timeout: int = 180, **settings: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API") and k != "RAY_ADDRESS"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), KEYNES_CACHE=str(tmp_path / "cache"),
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=str(startup_timeout), **settings)
    return keynes_run_with(config, env, *args)


def keynes_run_with(config, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`keynes run` in a subprocess with exactly this environment."""
    return subprocess.run([sys.executable, "-m", "cli.app", "run", str(config), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_complete_continue_experiment_says_so_in_the_terminal(tmp_path, session_cli):
    env, ray_address = session_cli  # what is said is the point, not start-up: the session's Prefect and Ray
    config = tmp_path / "once.yaml"
    config.write_text(yaml.safe_dump({
        "name": "once [v2] :x:", "seed": 1, "population": {"size": 10}, "game": {"rounds": 1},
        "workers": {"actors": 1, "shard_size": 10, "ray_address": ray_address}, "report": {"enabled": False},
        "continue": True, "db": str(tmp_path / "once runs.duckdb"),
    }))
    first = keynes_run_with(config, env)
    assert first.returncode == 0 and "done: 1 round(s) played, 10 guesses written" in first.stderr, first.stderr
    # the name as written: no markup (a "[v2]" stays in the header), no emoji
    assert first.stderr.startswith("once [v2] :x: (once [v2] :x:-"), first.stderr
    # the command to query them, on one line (the terminal folds it) and ready to paste
    db = shlex.quote(str(tmp_path / "once runs.duckdb"))
    assert f'. Query them: keynes sql --db {db} "select * from round_summary"\n' in first.stderr, first.stderr
    again = keynes_run_with(config, env)
    assert again.returncode == 0, again.stderr
    assert "is complete: all 1 round(s) of 1 arm(s) are in" in again.stderr and "nothing to play" in again.stderr
    assert "0 round(s) played" not in again.stderr
    bad = keynes_run_with(config, env, "--set", "population.size=-3")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["error: population.size: -3: input should be greater than 0"]


@pytest.mark.slow
def test_a_temporary_prefect_api_that_starts_too_slowly_is_one_clear_line_and_runs_nothing(tmp_path):
    db = tmp_path / "late.duckdb"
    config = tmp_path / "late.yaml"
    config.write_text(yaml.safe_dump({
        "name": "late", "seed": 1, "population": {"size": 10}, "game": {"rounds": 1},
        "workers": {"actors": 1, "shard_size": 10}, "report": {"enabled": False}, "db": str(db),
    }))
    # An API that cannot start in time, whatever the machine: its database is a Postgres address that
    # accepts connections and never answers, which holds the API's start up for minutes. (The API's
    # own few-second start would race the run's: at times it is up when the run begins to wait.)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        late = keynes_run(config, tmp_path, startup_timeout=1,
                          PREFECT_API_DATABASE_CONNECTION_URL=f"postgresql+asyncpg://keynes:keynes@127.0.0.1:{silent.getsockname()[1]}/prefect",
                          PREFECT_API_DATABASE_CONNECTION_TIMEOUT="600", PREFECT_API_DATABASE_TIMEOUT="600")
    assert late.returncode == 2, late.stderr[-3000:]
    assert late.stderr.strip().splitlines()[-1] == (
        "error: Prefect's temporary API did not start within 1 s (PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); "
        "nothing was run. Give it longer, or start a server (prefect server start) and "
        "export PREFECT_API_URL=http://127.0.0.1:4200/api")
    assert "Traceback" not in late.stderr
    assert not db.exists()
