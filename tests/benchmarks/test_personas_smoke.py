"""benchmarks/personas.py at 2,000 personas (its default is a million): it runs and its figures add up."""

from __future__ import annotations

import re

from tests.benchmarks.smoke import NUMBER, figures, run_benchmark

N = 2_000


def test_the_personas_benchmark_prints_its_figures():
    out = run_benchmark("personas.py", "--n", str(N), "--repeat", "2", timeout=300)
    # The default spec (adults, with names drawn from the locale's name lists).
    assert re.search(rf"^spec adults \(quota\): {N:,} personas, columns: agent_id, .*\bname\b", out, re.MULTILINE), out
    first, best, rate, load = figures(
        rf"sampling: first run ({NUMBER}) s, best of 2 ({NUMBER}) s, ({NUMBER}) personas/s "
        rf"\(loading the name lists once per process: ({NUMBER}) s\)", out)
    assert 0 < best <= first and load > 0
    # The rate is the best run's: N / best, within the millisecond the time is printed to.
    assert N / (best + 0.0005) <= rate <= N / max(best - 0.0005, 1e-9), (rate, best)
    frame, peak, before = figures(rf"frame ({NUMBER}) MiB; peak RSS ({NUMBER}) MiB \(before sampling ({NUMBER}) MiB\)", out)
    assert frame > 0 and peak >= before > 0
