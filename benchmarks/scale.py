"""The paper's scale benchmark: N dummy agents (wait, then a random integer) through the real flow.

Runs ``flows.experiment.experiment`` with the ``simulated`` engine (uniform rule) for one round
at each size, once with ``latency_s`` (1 s, the paper's dummy agent) and once with 0 (pure
framework overhead), and prints one table. Every stage runs: persona sampling, sharding onto
Ray actors, prompt rendering, engine calls, answer parsing, environment, DuckDB commits.

    uv run python benchmarks/scale.py                       # 10k, 100k, 1M
    uv run python benchmarks/scale.py --sizes 10000         # the CI smoke size
    uv run python benchmarks/scale.py --nodes 3 --sizes 100000 --latencies 0   # multi-node
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cli.runtime import settings  # noqa: E402

# Before Prefect is imported: its settings are read at import.
settings.apply({"RAY_AUTH_MODE": "disabled"})

#: Paper figures (arXiv 2407.17789, Sec. 5.1): 1M dummy agents, each sleeps 1 s then answers.
PAPER = {
    "AgentScope, 4 nodes x 64 cores": 40.0,
    "plain Python asyncio (paper's estimate)": 8.6 * 3600,
    "serial loop (paper's estimate)": 12 * 24 * 3600,
}


@dataclass
class Row:
    """One benchmark run."""

    agents: int
    latency_s: float
    wall_s: float
    rate: float
    peak_mb: float
    cpu_s: float
    shards: int
    rows: int
    nodes: dict[str, int]
    report_s: float | None = None
    analyses_s: float = 0.0
    arms: int = 1


class MemorySampler:
    """Samples the summed RSS and CPU time of this process and all its descendants.

    With a local Ray the descendants are every Ray process (GCS, raylet, dashboard agents,
    workers and actors) and Prefect's temporary API server, so the sum is the whole
    footprint of the run. RSS counts pages shared between processes (Ray's object store
    is shared memory) once per process, so the sum is an upper bound. CPU seconds are
    what the run's processes used (others' load on the machine excluded); a process that
    ends between two samples loses at most one interval of its count.
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.peak = 0
        self._cpu_start: dict[int, float] = {}
        self._cpu_last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self, baseline: bool = False) -> int:
        me = psutil.Process()
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
                times = proc.cpu_times()
                cpu = times.user + times.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            with self._lock:
                # a process first seen after the baseline started during the run
                self._cpu_start.setdefault(proc.pid, cpu if baseline else 0.0)
                self._cpu_last[proc.pid] = cpu
        return total

    @property
    def cpu_s(self) -> float:
        """CPU seconds used by every sampled process since ``reset``."""
        self.sample()
        with self._lock:
            return sum(self._cpu_last[p] - self._cpu_start[p] for p in self._cpu_last)

    def reset(self) -> None:
        with self._lock:
            self._cpu_start.clear()
            self._cpu_last.clear()
        self.peak = self.sample(baseline=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            self._stop.wait(self.interval_s)


def config(n: int, latency_s: float, args: argparse.Namespace, db: Path, ray_address: str | None) -> dict:
    """The experiment config of one run: what a user would write in YAML."""
    return {
        "name": f"scale-{n}-{latency_s:g}s",
        "seed": 1,
        "population": {"spec": "education.yaml", "size": n},
        "game": {"ratio": "2/3", "rounds": 1},
        "arms": {
            "engines": [
                {
                    "kind": "simulated",
                    "rule": "uniform",
                    "latency_s": latency_s,
                    "concurrency": args.concurrency,
                    "num_cpus": args.actor_cpus,
                }
            ],
            "prompts": args.prompts.split(","),
        },
        "workers": {"ray_address": ray_address, "actors": args.actors, "shard_size": args.shard_size},
        "db": str(db),
        # The report page is not one of the paper's stages: it is timed on its own (--report).
        "report": {"enabled": False},
    }


def run_one(n: int, latency_s: float, args, workdir: Path, sampler: MemorySampler, ray_address: str | None) -> Row:
    """Run the experiment flow once on a fresh warehouse and measure it."""
    import duckdb

    from flows.experiment import experiment

    db = workdir / f"scale-{n}-{latency_s:g}.duckdb"
    for leftover in (db, db.with_suffix(".duckdb.wal")):
        leftover.unlink(missing_ok=True)
    sampler.reset()
    start = time.perf_counter()
    summary = experiment(config(n, latency_s, args, db, ray_address))
    wall = time.perf_counter() - start
    peak, cpu = sampler.peak, sampler.cpu_s
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("select count(*) from guesses").fetchall()[0][0]
        shards = con.execute("select count(*) from shards").fetchall()[0][0]
        nodes = dict(con.execute("select node, count(*) from shards group by node order by node").fetchall())
    arms = summary.arms
    if rows != n * arms or summary.rows_written != n * arms:
        raise SystemExit(f"{n} agents × {arms} arm(s): {rows} guesses stored, {summary.rows_written} written — expected {n * arms}")
    report_s = None
    if args.report:
        from reports.export import write_reports

        t = time.perf_counter()
        write_reports(str(db), str(workdir / f"scale-{n}-{latency_s:g}-report.html"), summary.experiment_id)
        report_s = time.perf_counter() - t
    if not args.keep_db:
        db.unlink(missing_ok=True)
    return Row(n, latency_s, wall, rows / wall, peak / 2**20, cpu, shards, rows, nodes, report_s, summary.analyses_s, arms)


def start_ray(args) -> tuple[str | None, object | None, float]:
    """A local Ray (or a local multi-node cluster), on 127.0.0.1; returns (address, cluster, seconds)."""
    from tasks.pool import LOOPBACK, ensure_ray

    start = time.perf_counter()
    if args.nodes > 1:
        from ray.cluster_utils import Cluster

        node = {"num_cpus": args.cpus_per_node, "node_ip_address": LOOPBACK}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        for _ in range(args.nodes - 1):
            cluster.add_node(**node)
        cluster.wait_for_nodes()
        ensure_ray(cluster.address)
        return cluster.address, cluster, time.perf_counter() - start
    for attempt in range(3):
        try:
            ensure_ray(num_cpus=args.ray_cpus)
            break
        except Exception as exc:  # Ray gives its node 30 s to start: a busy machine can miss it
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
            import ray

            ray.shutdown()
    return None, None, time.perf_counter() - start


def machine() -> str:
    cpus = os.cpu_count()
    ram = psutil.virtual_memory().total / 2**30
    load = os.getloadavg()[0]
    return f"{platform.node()}: {cpus} cores, {ram:.0f} GiB RAM, Python {platform.python_version()}, load average {load:.1f} at start"


def linear_fits(rows: list[Row]) -> list[str]:
    """Per latency, the least-squares line wall = fixed + per_agent × agents, and how far
    the measured runs lie from it: the check that time grows linearly with the agents."""
    lines = []
    for latency in sorted({r.latency_s for r in rows}, reverse=True):
        runs = [r for r in rows if r.latency_s == latency]
        if len({r.agents for r in runs}) < 2:
            continue
        n = np.array([r.rows for r in runs], np.float64)  # agents × arms
        unit = "agents" if all(r.arms == 1 for r in runs) else "decisions"
        wall = np.array([r.wall_s for r in runs])
        slope, fixed = np.polyfit(n, wall, 1)
        worst = float(np.abs(fixed + slope * n - wall).max())
        lines.append(
            f"linear fit, latency {latency:g} s: wall ≈ {fixed:.1f} s + {slope * 1e6:.2f} s per million {unit} "
            f"(largest deviation {worst:.1f} s; beyond the fixed cost {1 / slope:,.0f} decisions/s)"
            if slope > 0 else f"linear fit, latency {latency:g} s: wall does not grow with agents here"
        )
    return lines


def print_table(rows: list[Row], args, startup: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title="keynes scale benchmark: simulated uniform agents, one round, full experiment flow")
    columns = ["agents", "latency s", "wall s", "decisions/s", "peak memory MB", "CPU s", "shards", "rows in DuckDB", "analyses s"]
    for column in columns + (["report page s"] if args.report else []):
        table.add_column(column, justify="right")
    for r in rows:
        cells = [f"{r.agents:,}", f"{r.latency_s:g}", f"{r.wall_s:.1f}", f"{r.rate:,.0f}", f"{r.peak_mb:,.0f}", f"{r.cpu_s:.1f}", f"{r.shards}", f"{r.rows:,}", f"{r.analyses_s:.2f}"]
        table.add_row(*cells, *([f"{r.report_s:.1f}"] if args.report else []))
    console.print(table)
    console.print(
        f"settings: actors={args.actors} (at most one per shard; num_cpus={args.actor_cpus} each), shard_size={args.shard_size:,}, "
        f"simulated concurrency={args.concurrency:,} requests per actor, Ray CPUs={args.ray_cpus if args.nodes == 1 else f'{args.nodes} nodes x {args.cpus_per_node}'}",
        highlight=False,
    )
    console.print(
        "startup (not in wall s): " + ", ".join(f"{k} {v:.1f} s" for k, v in startup.items())
        + ". Peak memory: summed RSS of the driver and every descendant process (all Ray processes, Prefect's API server);"
        " CPU s: CPU time those processes used during the run; analyses s (in wall s): the τ fits and paired tests"
        " the flow stores as each round lands.",
        highlight=False,
    )
    for line in linear_fits(rows):
        console.print(line, highlight=False)
    console.print(f"machine: {machine()}", highlight=False)
    if args.nodes > 1:
        for r in rows:
            spread = ", ".join(f"{node[:8]}…: {count}" for node, count in r.nodes.items())
            console.print(f"shards per node at {r.agents:,} agents, latency {r.latency_s:g} s: {spread}", highlight=False)
    paper = ", ".join(f"{k}: {v:,.0f} s" for k, v in PAPER.items())
    console.print(f"paper (1M agents, 1 s latency): {paper}", highlight=False)


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000", help="Comma-separated agent counts.")
    parser.add_argument("--latencies", default="1,0", help="Comma-separated simulated latencies in seconds.")
    parser.add_argument("--actors", type=int, default=4, help="Ray actors (each owns one simulated engine).")
    parser.add_argument("--actor-cpus", type=float, default=0.5, help="num_cpus reserved per actor.")
    parser.add_argument("--shard-size", type=int, default=50_000, help="Agents per shard.")
    parser.add_argument("--concurrency", type=int, default=50_000, help="Requests one simulated engine admits at once.")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray.")
    parser.add_argument("--nodes", type=int, default=1, help="Ray nodes: >1 starts a local multi-node cluster.")
    parser.add_argument("--cpus-per-node", type=int, default=1, help="CPUs per node of the multi-node cluster.")
    parser.add_argument("--warmup", type=int, default=1000, help="Agents of the untimed warm-up run that starts Prefect's API (0: none).")
    parser.add_argument("--prompts", default="basic",
                        help="Comma-separated prompt modes, one arm each (basic,cot: two arms, compared by paired tests).")
    parser.add_argument("--report", action=argparse.BooleanOptionalAction, default=True,
                        help="After each run, build its report page (timed apart, not in wall s).")
    parser.add_argument("--workdir", default=None, help="Where the DuckDB files go (default: a temporary folder).")
    parser.add_argument("--keep-db", action="store_true", help="Keep the DuckDB files.")
    parser.add_argument("--json", default=None, help="Also write the rows as JSON here.")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    latencies = [float(s) for s in args.latencies.split(",")]

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="keynes-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    cluster = None
    with MemorySampler() as sampler:
        startup: dict[str, float] = {}
        address, cluster, startup["Ray"] = start_ray(args)
        try:
            # Prefect's temporary API starts with the first flow; a warm-up run of 1,000
            # agents pays that (and imports) so the table measures the steady state.
            if args.warmup:
                t = time.perf_counter()
                run_one(args.warmup, 0.0, args, workdir, sampler, address)
                startup[f"Prefect API + warm-up run of {args.warmup:,} agents"] = time.perf_counter() - t
            for latency in latencies:
                for n in sizes:
                    row = run_one(n, latency, args, workdir, sampler, address)
                    print(f"  {n:>9,} agents, latency {latency:g} s: {row.wall_s:6.1f} s, {row.rate:10,.0f}/s, peak {row.peak_mb:,.0f} MB, CPU {row.cpu_s:.1f} s", flush=True)
                    rows.append(row)
        finally:
            import ray

            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
    print_table(rows, args, startup)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return rows


if __name__ == "__main__":
    main()
