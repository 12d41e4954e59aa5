"""Shard size: keynes's own size beside pinned ones, and `keynes plan`'s estimate beside each wall.

Usage: uv run python benchmarks/shard_size.py [--agents 20000] [--pinned 1000,5000,50000] [--small 5]

The quickstart scaled as a new user scales it: `keynes run experiments/quickstart.yaml --set
population.size=N --set game.rounds=1 --set 'arms.prompts=[basic]'` (Gemma 3 270M on llama.cpp,
2 actors, no report), once with the shard size keynes picks (`workers.shard_size` unset) and once
with each pinned size (`--pinned`), plus `--small` (the quickstart's old pin, 5: thousands of
shards, where their fixed cost is the wall; 0 leaves it out). Before each run, `keynes plan` of
the same command (`--format json`). Each run is a subprocess on a new warehouse, one after the
other in this one invocation, so that they share the machine's load; compare the ratios.

Per run it prints the shard size the run recorded (the experiment's config in the warehouse) and
the shards its round committed, the command's wall, the round's own seconds (`rounds.seconds`:
play, load and outcome), its play (from the first shard's start on its actor to the last commit:
without waiting for actors that still load their model, and without round 1's distinct prompts
answered ahead of the shards) and the plan's time (which leaves out starting Ray and the model, as
`keynes plan` says, and counts those prompts): the round holds a wait the plan leaves out, the play
lacks work the plan counts, so the plan is set beside both. Then the default's wall over the best
pinned one's (target: at most 1.5) and, for the round and for the play, the plan's ratio furthest
from 1 (target: within 2x).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import REPO, keynes_command  # noqa: E402

CONFIG = REPO / "experiments" / "quickstart.yaml"


def overrides(agents: int, shard_size: int | None, db: Path) -> list[str]:
    """The user's command's ``--set`` arguments (and the benchmark's own: no report, its warehouse)."""
    sets = [f"population.size={agents}", "game.rounds=1", "arms.prompts=[basic]", "report.enabled=false", f"db={db}"]
    if shard_size is not None:
        sets.append(f"workers.shard_size={shard_size}")
    return [part for s in sets for part in ("--set", s)]


def planned(agents: int, shard_size: int | None, db: Path) -> tuple[float, float | None]:
    """`keynes plan`'s time of the run and the start it adds (None: no run like it recorded here yet), in seconds."""
    result = subprocess.run([*keynes_command(), "plan", str(CONFIG), *overrides(agents, shard_size, db), "--format", "json"],
                            cwd=REPO, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"keynes plan failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    (row,) = json.loads(result.stdout.strip().splitlines()[-1])
    return float(row["seconds"]), row.get("start_seconds")


#: Ray gives its local node 30 s to start (a constant of ray._private.node); on a machine under
#: heavy load it can take longer, and `keynes run` then fails before it plays: such a run is
#: started again (on a new warehouse), at most this many times in all.
ATTEMPTS = 3
RAY_START_TIMEOUT = "The current node timed out during startup"


def played(agents: int, shard_size: int | None, db: Path) -> dict[str, float]:
    """`keynes run` of the command: its wall, and what its warehouse holds of the round."""
    for attempt in range(1, ATTEMPTS + 1):
        db.unlink(missing_ok=True)
        start = time.perf_counter()
        result = subprocess.run([*keynes_command(), "run", str(CONFIG), *overrides(agents, shard_size, db)],
                                cwd=REPO, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - start
        if result.returncode == 0 or RAY_START_TIMEOUT not in result.stdout + result.stderr or attempt == ATTEMPTS:
            break
        print(f"  (Ray's node did not start within its 30 s, load average {os.getloadavg()[0]:.1f}: run again)", file=sys.stderr, flush=True)
    if result.returncode != 0:
        sys.exit(f"keynes run failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    with duckdb.connect(str(db), read_only=True) as con:
        size = con.execute("SELECT json_extract(config, '$.workers.shard_size')::BIGINT FROM experiments").fetchone()[0]
        shards, stored = con.execute("SELECT count(*), sum(n) FROM shards").fetchone()
        (round_s,) = con.execute("SELECT seconds FROM rounds").fetchone()
        # From the first shard's start on its actor to the last commit: the round without the
        # wait for actors still loading their model (which the plan leaves out, and which a loaded
        # machine pushes into the round).
        (play_s,) = con.execute("SELECT epoch(max(committed_at)) - min(epoch(committed_at) - seconds) FROM shards").fetchone()
    if stored != agents:
        sys.exit(f"the run stored {stored} guesses in its shards, expected {agents}")
    return {"size": size, "shards": shards, "wall": wall, "round": round_s, "play": play_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=20_000, help="Agents (population.size) of every run.")
    parser.add_argument("--pinned", default="1000,5000,50000", help="Pinned shard sizes, comma-separated; the best of them is the reference.")
    parser.add_argument("--small", type=int, default=5, help="A small pinned size run last, beside the plan (0: none).")
    args = parser.parse_args()
    try:
        pinned = [int(s) for s in args.pinned.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--pinned: {args.pinned!r} is not a list of whole numbers")
    if args.agents < 1 or not pinned or min(pinned) < 1 or args.small < 0:
        parser.error("--agents and every --pinned size: at least 1; --small: 0 or more")
    print(f"shard size: keynes run experiments/quickstart.yaml --set population.size={args.agents} --set game.rounds=1 "
          f"--set 'arms.prompts=[basic]' (no report), keynes plan before each run; {' '.join(keynes_command())}")
    settings: list[tuple[str, int | None]] = [("default", None), *((f"{s:,}", s) for s in pinned)]
    if args.small:
        settings.append((f"{args.small:,} (small)", args.small))
    rows = []
    print(f"  {'shard_size':<16} {'size':>7} {'shards':>7} {'wall s':>8} {'round s':>8} {'play s':>8} {'plan s':>8} {'plan/round':>10} {'plan/play':>9}", flush=True)
    with tempfile.TemporaryDirectory(prefix="keynes-shard-size-") as tmp:
        for i, (label, size) in enumerate(settings):
            db = Path(tmp) / f"run{i}.duckdb"
            plan_s, start_s = planned(args.agents, size, db)
            r = {"label": label, "plan": plan_s, "start": start_s, **played(args.agents, size, db)}
            rows.append(r)
            print(f"  {r['label']:<16} {r['size']:>7,} {r['shards']:>7,} {r['wall']:>8.1f} {r['round']:>8.1f} {r['play']:>8.1f} "
                  f"{r['plan']:>8.1f} {r['plan'] / r['round']:>10.2f} {r['plan'] / r['play']:>9.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores after the runs")
    default = rows[0]
    best = min(rows[1:1 + len(pinned)], key=lambda r: r["wall"])
    print(f"default/best pinned ({best['label']}): wall {default['wall']:.1f} s / {best['wall']:.1f} s = "
          f"{default['wall'] / best['wall']:.2f}x (target: at most 1.5x)")
    for column in ("round", "play"):
        worst = max(rows, key=lambda r: max(r["plan"] / r[column], r[column] / r["plan"]))
        print(f"plan/{column} furthest from 1: {worst['label']} {worst['plan'] / worst[column]:.2f}x (target: between 0.5x and 2x)")
    # The plan with the start the previous run recorded (the first run has none before it).
    started = [r for r in rows if r["start"] is not None]
    for r in started:
        print(f"plan with its start/wall: {r['label']} ({r['plan']:.1f} s + start {r['start']:.1f} s) / {r['wall']:.1f} s = "
              f"{(r['plan'] + r['start']) / r['wall']:.2f}x")
    if started:
        worst = max(started, key=lambda r: max((r["plan"] + r["start"]) / r["wall"], r["wall"] / (r["plan"] + r["start"])))
        print(f"plan with its start/wall furthest from 1: {worst['label']} {(worst['plan'] + worst['start']) / worst['wall']:.2f}x "
              "(target: between 0.5x and 2x)")
    for r in rows:
        if r["shards"] != math.ceil(args.agents / r["size"]):
            sys.exit(f"{r['label']}: {r['shards']} shards committed, expected {math.ceil(args.agents / r['size'])}")


if __name__ == "__main__":
    main()
