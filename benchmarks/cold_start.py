"""Cold start: how long a fresh `keynes run` takes to its first decisions, Gemma beside the simulated engine.

Usage: uv run python benchmarks/cold_start.py [--agents 20000] [--shard-size 1000] [--repeat 1] [--prefect-home DIR] [--source DIR]

Each run is the installed `keynes run` (a subprocess, as a user types it) on a new warehouse:
N agents of populations/education.yaml, round 1, one arm (the basic prompt), 2 actors, shards of
1,000 (``--shard-size``), no report; with no PREFECT_API_URL and no RAY_ADDRESS, so that it starts Prefect's temporary
API and a local Ray of its own, as a user's run does. The engines take turns, (a) Gemma 3 270M on
llama.cpp (shared context, the default) and (b) the simulated engine with latency 0, and each run
prints its timeline in seconds after the command started: its header line on stderr (read as it
arrives), the experiment's row (`experiments.created_at`), its run's row (`runs.started_at`), the
first and last shard committed (`shards.committed_at`), and the process's exit; then the ratio of
the walls, Gemma over simulated. With `KEYNES_TIMINGS=1` (set here) keynes writes the moment of
each phase to stderr (tasks/timings.py): they are printed below each run's timeline.

Prefect's temporary API needs a migrated database: without --prefect-home the benchmark makes one
first, untimed (what a user's first run does once), and every run starts its API on it. The
model's files (and the answer vocabulary keynes caches beside them) are the user's cache, as warm
as after a first run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import REPO, keynes_command  # noqa: E402

sys.path.insert(0, str(REPO))
from tasks.timings import ENV as TIMINGS_ENV  # noqa: E402
from tasks.timings import PREFIX as TIMING_PREFIX  # noqa: E402

ENGINES = {
    "gemma": {"kind": "llamacpp", "shared_context": True},
    "simulated": {"kind": "simulated", "latency_s": 0.0},
}
#: The timeline's points, in the order they happen.
POINTS = ("header printed", "experiment row created", "run row created", "first shard committed", "last shard committed", "process exit")
HEADER = re.compile(r"\): [\d,]+ agents × ")
TIMING = re.compile(rf"{TIMING_PREFIX} (\d+\.\d+) (\d+) (.+)$")


def write_config(path: Path, engine: str, agents: int, shard_size: int = 1000) -> None:
    """The experiment of one run, as YAML."""
    config = {
        "name": f"cold-start-{engine}",
        "seed": 7,
        "population": {"spec": "education.yaml", "size": agents},
        "game": {"ratio": "2/3", "rounds": 1},
        "arms": {"engines": [ENGINES[engine]], "prompts": ["basic"]},
        "workers": {"actors": 2, "shard_size": shard_size},
        "report": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def migrated_home(folder: Path) -> Path:
    """A PREFECT_HOME holding a migrated database (``prefect server database upgrade``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(folder), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    done = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"migrating Prefect's database failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    return folder


def _read(stream, lines: list[tuple[float, str]]) -> None:
    for line in stream:
        lines.append((time.time(), line.rstrip("\n")))


def run_once(engine: str, agents: int, folder: Path, prefect_home: Path, source: Path | None,
             shard_size: int = 1000, extra_env: dict[str, str] | None = None,
             output: list[tuple[float, str]] | None = None) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """One cold ``keynes run`` (of the checkout ``source``, if given; ``extra_env`` added to its
    environment): its timeline (seconds after the command started) and its phases. ``output``,
    if given, receives every line the command printed."""
    config, db = folder / f"{engine}.yaml", folder / f"{engine}.duckdb"
    write_config(config, engine, agents, shard_size)
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    # RAY_DEDUP_LOGS=0: Ray would fold the actors' timing lines, alike but for their numbers, into one.
    env.update(PREFECT_HOME=str(prefect_home), RAY_DEDUP_LOGS="0", **{TIMINGS_ENV: "1"}, **(extra_env or {}))
    command = keynes_command()
    if source is not None:  # ahead of the installed (editable) keynes, for this process and its Ray workers
        env["PYTHONPATH"] = os.pathsep.join([str(source.resolve())] + [p for p in [env.get("PYTHONPATH")] if p])
        command = [sys.executable, "-m", "cli.app"]
    lines: list[tuple[float, str]] = output if output is not None else []
    start = time.time()
    process = subprocess.Popen(command + ["run", str(config), "--db", str(db)], cwd=folder, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    readers = [threading.Thread(target=_read, args=(s, lines), daemon=True) for s in (process.stdout, process.stderr)]
    for reader in readers:
        reader.start()
    code = process.wait()
    exited = time.time()
    for reader in readers:
        reader.join()
    if code != 0:
        sys.exit(f"keynes run ({engine}) failed (exit {code}):\n" + "\n".join(text for _, text in lines)[-3000:])
    header = next((t for t, text in lines if HEADER.search(text)), None)
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "select (select epoch_us(min(created_at)) from experiments), (select epoch_us(min(started_at)) from runs), "
            "(select epoch_us(min(committed_at)) from shards), (select epoch_us(max(committed_at)) from shards), "
            "(select count(*) from guesses)"
        ).fetchone()
    if header is None or None in rows or rows[-1] != agents:
        sys.exit(f"keynes run ({engine}): no header line, or not every agent's guess stored ({rows[-1]} of {agents})")
    moments = [header, *(us / 1e6 for us in rows[:4]), exited]
    timeline = {point: moment - start for point, moment in zip(POINTS, moments)}
    phases = []
    for _, text in lines:
        found = TIMING.search(text)
        if found:
            phases.append((float(found.group(1)) - start, f"{found.group(2)} {found.group(3)}"))
    return timeline, sorted(phases, key=lambda phase: phase[0])


def print_timelines(title: str, timelines: dict[str, dict[str, float]]) -> None:
    """The engines' timelines side by side, then the ratio of their walls."""
    print(title)
    print(f"  {'seconds after the command starts':34s}" + "".join(f"{engine:>11s}" for engine in timelines))
    for point in POINTS:
        print(f"  {point:34s}" + "".join(f"{timeline[point]:11.2f}" for timeline in timelines.values()))
    gemma, simulated = timelines["gemma"]["process exit"], timelines["simulated"]["process exit"]
    print(f"  wall: gemma {gemma:.2f} s, simulated {simulated:.2f} s: gemma/simulated {gemma / simulated:.2f}x")


def print_phases(engine: str, phases: list[tuple[float, str]]) -> None:
    """Each phase keynes marked (KEYNES_TIMINGS=1), the processes named by their order of appearance."""
    if not phases:
        print(f"  phases of {engine}: none marked (a keynes without KEYNES_TIMINGS)")
        return
    names: dict[str, str] = {}
    print(f"  phases of {engine} (KEYNES_TIMINGS=1), seconds after the command starts:")
    for seconds, text in phases:
        pid, phase = text.split(" ", 1)
        kind = phase.split(":", 1)[0]
        if kind == "actor":
            names.setdefault(pid, f"actor {sum(1 for n in names.values() if n.startswith('actor')) + 1}")
            phase = f"{names[pid]}{phase.removeprefix('actor')}"
        print(f"    {seconds:7.2f}  {phase}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20_000, help="Agents (population size) of each run.")
    parser.add_argument("--shard-size", type=int, default=1000, help="Agents per shard (a million agents: 50,000, as keynes' scale runs use).")
    parser.add_argument("--repeat", type=int, default=1, help="Runs per engine, the engines taking turns; each run's figures are printed, then the best and the median ratio.")
    parser.add_argument("--prefect-home", type=Path, help="A PREFECT_HOME with a migrated database (default: one made first, untimed).")
    parser.add_argument("--source", type=Path, help="Run the keynes of this source checkout (e.g. an earlier commit's `git worktree`) "
                        "instead of the installed script: python -m cli.app with the checkout first on PYTHONPATH.")
    args = parser.parse_args()
    if args.repeat < 1 or args.agents < 1:
        parser.error("--repeat and --agents: at least 1")
    if args.source is not None and not (args.source / "cli" / "app.py").is_file():
        parser.error(f"--source: {str(args.source)!r} is not a keynes checkout (no cli/app.py)")
    keynes = f"python -m cli.app from {args.source}" if args.source else " ".join(keynes_command())
    print(f"cold start: keynes run, {args.agents:,} agents of education.yaml, round 1, basic prompt, 2 actors, shards of {args.shard_size:,}, "
          f"no report; {keynes}")
    with tempfile.TemporaryDirectory(prefix="keynes-cold-start-") as tmp:
        home = args.prefect_home or migrated_home(Path(tmp) / "prefect")
        runs: list[dict[str, dict[str, float]]] = []
        for repeat in range(1, args.repeat + 1):
            timelines, phases = {}, {}
            for engine in ENGINES:
                folder = Path(tmp) / f"{engine}-{repeat}"
                folder.mkdir()
                timelines[engine], phases[engine] = run_once(engine, args.agents, folder, home, args.source, args.shard_size)
            runs.append(timelines)
            print_timelines(f"run {repeat} of {args.repeat} (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):", timelines)
            for engine in ENGINES:
                print_phases(engine, phases[engine])
    if args.repeat > 1:
        best = {engine: {point: min(run[engine][point] for run in runs) for point in POINTS} for engine in ENGINES}
        print_timelines(f"best of {args.repeat} (each point's earliest):", best)
        print(ratio_summary(runs))


def ratio_summary(runs: list[dict[str, dict[str, float]]]) -> str:
    """Each run's walls' ratio, Gemma over simulated, and their median: on a shared machine a
    ratio moves from run to run by more than a 10% goal, so one run, or the best points, say little."""
    ratios = [run["gemma"]["process exit"] / run["simulated"]["process exit"] for run in runs]
    walls = {engine: statistics.median(run[engine]["process exit"] for run in runs) for engine in ENGINES}
    return (f"gemma/simulated per run: {', '.join(f'{r:.2f}' for r in ratios)}x; median {statistics.median(ratios):.2f}x "
            f"(median walls: gemma {walls['gemma']:.2f} s, simulated {walls['simulated']:.2f} s)")


if __name__ == "__main__":
    main()
