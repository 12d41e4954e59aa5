"""benchmarks/cli_start.py on a warehouse of a few personas (or a tiny simulated run): it runs and
its figures add up."""

from __future__ import annotations

import os
import re

import pytest

from tests.benchmarks.smoke import NUMBER, figures, ratio_of_printed, run_benchmark


def check_figures(out: str, repeat: int) -> None:
    """Each command's best time is printed, and each ratio is that time over DuckDB's alone."""
    assert re.search(rf"^best of {repeat} fresh processes each \(load average [\d.]+ on \d+ cores\):$", out, re.MULTILINE), out
    (bare,) = figures(rf"^  duckdb alone\s+({NUMBER}) s$", out)
    assert bare > 0
    for label in (r'keynes sql "select 1"', r"keynes --help"):
        seconds, ratio = figures(rf"^  {re.escape(label)}\s+({NUMBER}) s  ({NUMBER})x duckdb alone$", out)
        assert seconds > 0 and ratio_of_printed(ratio, seconds, bare), (label, out)


def test_the_cli_start_benchmark_prints_its_figures():
    out = run_benchmark("cli_start.py", "--repeat", "2", "--agents", "5", timeout=300)
    made, personas, guesses, size = figures(
        rf"^warehouse: keynes\.duckdb made by keynes personas in ({NUMBER}) s: ({NUMBER}) personas, ({NUMBER}) guesses, ({NUMBER}) MB$", out)
    assert made > 0 and personas == 5 and guesses == 0 and size > 0
    check_figures(out, repeat=2)


@pytest.mark.slow  # a whole simulated `keynes run` (Prefect's temporary API and a local Ray start)
def test_the_cli_start_benchmark_on_a_simulated_run(prefect_home):
    env = dict(os.environ, PREFECT_HOME=str(prefect_home))  # a migrated Prefect database, as after a user's first run
    env.pop("RAY_ADDRESS", None)  # its own local Ray, as a user's run
    out = run_benchmark("cli_start.py", "--repeat", "1", "--agents", "4", "--make", "run", timeout=600, env=env)
    _, personas, guesses, _ = figures(
        rf"^warehouse: keynes\.duckdb made by keynes run in ({NUMBER}) s: ({NUMBER}) personas, ({NUMBER}) guesses, ({NUMBER}) MB$", out)
    assert (personas, guesses) == (4, 8)  # 4 agents, 1 round, 2 prompt modes
    check_figures(out, repeat=1)
