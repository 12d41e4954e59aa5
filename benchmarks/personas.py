"""Benchmark: sample a million personas from a spec; print the time and peak memory.

Usage: uv run python benchmarks/personas.py [--spec adults.yaml] [--n 1000000] [--repeat 3]
Name lists are loaded once before timing (printed separately); the best run is the steady state.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from populations.names import locale_names  # noqa: E402
from populations.sampler import sample  # noqa: E402
from populations.spec import load_spec  # noqa: E402


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="adults.yaml", help="A population spec (also looked up in populations/).")
    parser.add_argument("--n", type=int, default=1_000_000, help="Personas to sample.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="Timed runs (different seeds).")
    args = parser.parse_args()

    spec = load_spec(args.spec)
    start = time.perf_counter()
    if spec.names is not None:
        locale_names(spec.names.locale)  # once per process, like an import
    load_s = time.perf_counter() - start
    baseline = peak_rss_mib()
    times = []
    for i in range(args.repeat):
        start = time.perf_counter()
        frame = sample(spec, args.n, args.seed + i)
        times.append(time.perf_counter() - start)
        size_mib = frame.estimated_size() / 2**20
        del frame
    columns = ", ".join(c for c in sample(spec, 10, 0).columns)
    print(f"spec {spec.name} ({spec.sampling}): {args.n:,} personas, columns: {columns}")
    print(f"sampling: first run {times[0]:.3f} s, best of {args.repeat} {min(times):.3f} s, {args.n / min(times):,.0f} personas/s"
          f" (loading the name lists once per process: {load_s:.3f} s)")
    print(f"frame {size_mib:.1f} MiB; peak RSS {peak_rss_mib():.0f} MiB (before sampling {baseline:.0f} MiB)")


if __name__ == "__main__":
    main()
