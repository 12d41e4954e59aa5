"""Benchmark: how fast `keynes sql "select 1"` and `keynes --help` start, beside DuckDB alone.

Usage: uv run python benchmarks/cli_start.py [--repeat 5] [--make personas|run] [--agents 20]

Each figure is the best wall time of --repeat fresh processes, the three commands taking turns so
that a busy moment of the machine hits them alike: DuckDB alone in Python opening the warehouse
read-only for `select 1`, `keynes sql "select 1"` in the warehouse's folder (its default --db,
keynes.duckdb), and `keynes --help`. The warehouse is made first at a tiny size, by `keynes
personas` (the default, a few seconds) or by a simulated `keynes run` (half a minute).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[1]
BARE = "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True).sql('select 1').fetchall()"


def keynes_command() -> list[str]:
    """The installed `keynes` script beside this interpreter, as users call it (else the module)."""
    script = Path(sys.executable).with_name("keynes")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.app"]


def make_warehouse(folder: Path, how: str, agents: int) -> Path:
    """``folder/keynes.duckdb``, filled by a real keynes command at a tiny size."""
    db = folder / "keynes.duckdb"
    if how == "personas":
        args = ["personas", "education.yaml", "--n", str(agents), "--db", str(db)]
    else:
        args = ["run", str(REPO / "experiments" / "quickstart.yaml"), "--db", str(db), "--set", "arms.engines=[{kind: simulated}]",
                "--set", f"population.size={agents}", "--set", "game.rounds=1", "--set", "report.enabled=false"]
    done = subprocess.run(keynes_command() + args, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"making the warehouse failed (keynes {args[0]}): {done.stderr.strip()[-2000:]}")
    return db


def wall_s(command: list[str], cwd: Path, expect: str) -> float:
    """One fresh process's wall time; exits if it fails or its output lacks ``expect``."""
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or expect not in done.stdout:
        sys.exit(f"{' '.join(command)} failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="Fresh processes per command; the best wall time counts.")
    parser.add_argument("--make", choices=("personas", "run"), default="personas",
                        help="How the warehouse is made: `keynes personas` or a simulated `keynes run` (1 round, 2 prompt modes).")
    parser.add_argument("--agents", type=int, default=20, help="Personas (agents) in the warehouse.")
    args = parser.parse_args()
    if args.repeat < 1 or args.agents < 1:
        parser.error("--repeat and --agents: at least 1")

    with tempfile.TemporaryDirectory(prefix="keynes-cli-start-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        db = make_warehouse(folder, args.make, args.agents)
        made_s = time.perf_counter() - start
        with duckdb.connect(str(db), read_only=True) as con:
            personas, guesses = con.execute("select (select count(*) from personas), (select count(*) from guesses)").fetchone()
        print(f"warehouse: keynes.duckdb made by keynes {args.make} in {made_s:.1f} s: {personas:,} personas, {guesses:,} guesses, "
              f"{db.stat().st_size / 1e6:.1f} MB")
        commands = {
            "duckdb alone": ([sys.executable, "-c", BARE, str(db)], ""),
            'keynes sql "select 1"': (keynes_command() + ["sql", "select 1"], "1"),
            "keynes --help": (keynes_command() + ["--help"], "Usage"),
        }
        times: dict[str, list[float]] = {label: [] for label in commands}
        for _ in range(args.repeat):
            for label, (command, expect) in commands.items():
                times[label].append(wall_s(command, folder, expect))
    best = {label: min(values) for label, values in times.items()}
    bare = best["duckdb alone"]
    print(f"best of {args.repeat} fresh processes each (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):")
    for label, seconds in best.items():
        ratio = "" if label == "duckdb alone" else f"  {seconds / bare:.2f}x duckdb alone"
        print(f"  {label:24s} {seconds:6.3f} s{ratio}")


if __name__ == "__main__":
    main()
