"""Warm start: `keynes run` with a warm stack (`keynes up`) beside the same run cold, back to back.

Usage: uv run python benchmarks/warm_start.py [--agents 20000] [--shard-size 5000] [--engine gemma] [--repeat 1] [--prefect-home DIR]

The same experiment as benchmarks/cold_start.py (N agents of populations/education.yaml, round 1,
the basic prompt, 2 actors, no report) run by the installed `keynes run` on a new warehouse each
time, three times per repeat: cold (``KEYNES_WARM_STACK=off``: its own local Ray and Prefect's
temporary API, as without a stack), warm (it joins the stack that `keynes up` started before the
first repeat, and starts its actors, which the stack then keeps: tasks/kept.py) and again (the
same run, which finds those actors with their model loaded; and, the prompts being the same, the
answer distributions their engine computed). All share one model cache (``$KEYNES_CACHE``, as a
user's runs do) and one migrated Prefect database; `keynes down` ends the stack at the end. Each
repeat prints its timelines side by side (the points of cold_start.py: header, experiment row, run
row, first and last shard committed, exit), each warm wall over the cold one, and the phases keynes
marked (``KEYNES_TIMINGS=1``) of the warm runs, which say where their time goes (a kept actor's own
phases are printed to the run that started it). Each warm run must say that it joined the stack.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import keynes_command  # noqa: E402
from cold_start import ENGINES, POINTS, migrated_home, print_phases, run_once  # noqa: E402

#: What `keynes run` prints when it joins the stack (cli/runtime/stack.py: for_command).
JOINED = "joining the warm stack: "


def keynes(*args: str, env: dict[str, str]) -> float:
    """Run ``keynes ARGS`` (its output shown); seconds it took. Exits if it fails."""
    start = time.monotonic()
    done = subprocess.run(keynes_command() + list(args), env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines():
        print(f"  | {line}")
    if done.returncode != 0:
        sys.exit(f"keynes {' '.join(args)} failed (exit {done.returncode})")
    return time.monotonic() - start


#: Attempts at a run whose own local Ray missed Ray's fixed 30 s for its raylet (a busy machine).
ATTEMPTS = 3
RAY_TIMED_OUT = "The current node timed out during startup"
#: The runs of each repeat: cold, then warm twice (the first starts the actors the second finds).
KINDS = ("cold", "warm", "again")


def print_runs(title: str, timelines: dict[str, dict[str, float]]) -> None:
    """A repeat's runs side by side, then each warm run's wall over the cold one's (a cold run that
    failed every time: its column says so, and no ratio)."""
    print(title)
    print(f"  {'seconds after the command starts':34s}" + "".join(f"{kind:>11s}" for kind in KINDS))
    for point in POINTS:
        print(f"  {point:34s}" + "".join(f"{timelines[kind][point]:11.2f}" if kind in timelines else f"{'failed':>11s}" for kind in KINDS))
    if "cold" not in timelines:
        return
    cold = timelines["cold"]["process exit"]
    for kind in KINDS[1:]:
        wall = timelines[kind]["process exit"]
        print(f"  wall: {kind} {wall:.2f} s, cold {cold:.2f} s: {kind}/cold {wall / cold:.2f}; first shard committed: "
              f"{kind} {timelines[kind]['first shard committed']:.2f} s, cold {timelines['cold']['first shard committed']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20_000, help="Agents (population size) of each run.")
    parser.add_argument("--shard-size", type=int, default=5000, help="Agents per shard.")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="gemma", help="gemma: Gemma 3 270M on llama.cpp; simulated: latency 0.")
    parser.add_argument("--repeat", type=int, default=1, help="Rounds of runs (cold, warm, warm again); each one's figures, then the median ratios.")
    parser.add_argument("--prefect-home", type=Path, help="A PREFECT_HOME with a migrated database (default: one made first, untimed).")
    args = parser.parse_args()
    if args.repeat < 1 or args.agents < 1 or args.shard_size < 1:
        parser.error("--repeat, --agents and --shard-size: at least 1")
    print(f"warm start: keynes run, {args.agents:,} agents of education.yaml, round 1, basic prompt, {args.engine}, 2 actors, "
          f"shards of {args.shard_size:,}, no report; cold (its own Ray and Prefect API) then warm (joining `keynes up`'s); "
          f"{' '.join(keynes_command())}")
    with tempfile.TemporaryDirectory(prefix="keynes-warm-start-") as tmp:
        home = args.prefect_home or migrated_home(Path(tmp) / "prefect")
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS", "KEYNES_WARM_STACK")}
        env["PREFECT_HOME"] = str(home)
        print(f"keynes up: {keynes('up', env=env):.1f} s (once, untimed below)")
        runs: list[dict[str, dict[str, float]]] = []
        try:
            for repeat in range(1, args.repeat + 1):
                timelines, phases = {}, {}
                for kind in KINDS:
                    folder = Path(tmp) / f"{kind}-{repeat}"
                    folder.mkdir()
                    output: list[tuple[float, str]] = []
                    for attempt in range(1, ATTEMPTS + 1):
                        try:
                            output.clear()
                            timelines[kind], phases[kind] = run_once(args.engine, args.agents, folder, home, None, args.shard_size,
                                                                     extra_env={"KEYNES_WARM_STACK": "off" if kind == "cold" else ""},
                                                                     output=output)
                            break
                        except SystemExit as exc:  # run_once's one line: the command failed
                            if RAY_TIMED_OUT not in str(exc):
                                raise
                            print(f"the {kind} run failed: its local Ray did not start in time (a busy machine)"
                                  + ("; running it again" if attempt < ATTEMPTS else f", {ATTEMPTS} times: no figures for it"))
                            for stale in folder.iterdir():
                                stale.unlink()
                    if kind not in timelines:
                        continue
                    joined = any(JOINED in text for _, text in output)
                    if joined != (kind != "cold"):
                        sys.exit(f"the {kind} run {'joined' if joined else 'did not join'} the warm stack:\n"
                                 + "\n".join(text for _, text in output)[-3000:])
                runs.append(timelines)
                print_runs(f"repeat {repeat} of {args.repeat} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):", timelines)
                for kind in KINDS[1:]:
                    print_phases(kind, phases[kind])
        finally:
            print(f"keynes down: {keynes('down', env=env):.1f} s")
    runs = [run for run in runs if "cold" in run]
    if len(runs) > 1:
        for kind in KINDS[1:]:
            ratios = [run[kind]["process exit"] / run["cold"]["process exit"] for run in runs]
            print(f"{kind}/cold per repeat: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f} "
                  f"(median walls: cold {statistics.median(r['cold']['process exit'] for r in runs):.2f} s, {kind} "
                  f"{statistics.median(r[kind]['process exit'] for r in runs):.2f} s; median first shard committed: {kind} "
                  f"{statistics.median(r[kind]['first shard committed'] for r in runs):.2f} s)")

if __name__ == "__main__":
    main()
