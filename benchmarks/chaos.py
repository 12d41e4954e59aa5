"""Chaos: an experiment interrupted K times ends with the same warehouse as an uninterrupted run.

The benchmark writes a config, runs it once uninterrupted (``keynes run CONFIG --db
reference.duckdb``, a subprocess, as a user runs it), then runs it again into another file and
interrupts it ``--kills`` times at random moments (``random.Random(--seed)``; each drawn over the
first ``--window`` of its share of what the run is expected to last, shared evenly among the kills
still to come, so that all of them land before it completes), each kill of one of these kinds, all
kinds in turn in a shuffled order:

- ``run-sigkill``: SIGKILL of the ``keynes run`` process;
- ``actor-sigkill``: SIGKILL of one of its Ray actors' processes (``ray::AgentWorker``);
- ``api-sigkill``: SIGKILL of Prefect's temporary API server (uvicorn), its child when
  ``PREFECT_API_URL`` is unset (an attempt that is to suffer it runs without that variable);
- ``run-sigterm``: SIGTERM of the ``keynes run`` process;
- ``ctrl-c``: SIGINT to its process group, as a terminal sends it on Ctrl-C.

After a kill the same command runs again once the killed one has exited, until one completes
(the next kill lands in that rerun). A run survives the kill of an actor (Ray restarts it) or
of its temporary API (keynes starts it again, cli/runtime/temporary_api.py) and gets its next kill
later on. Then both warehouses are compared table by table (every table of the schema,
found by a query), without the columns of timing and placement: a sha256 over each table's
sorted rows, rows lost and rows extra (EXCEPT ALL both ways), rows duplicated (per key:
``count(*) - count(distinct key)``). Orphans: processes that carry a killed run's
``KEYNES_RUN_TAG`` (cli/runtime/processes.py) still running once the next run has started.

    uv run python benchmarks/chaos.py                                   # (a) 100,000 simulated agents, 5 rounds, 2 arms, K=20
    uv run python benchmarks/chaos.py --experiment gemma                # (b) 2,000 Gemma agents, 3 rounds, shared context
    uv run python benchmarks/chaos.py --agents 2000 --rounds 3 --shard-size 100 --latency 0.2 --kills 5   # the smoke size

Exits 1 if a hash differs, a row is lost, extra or duplicated, a process is orphaned, or a run
fails or hangs in a way its kill does not explain.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cli.runtime.processes import TAG, tag_of, tagged  # noqa: E402

KINDS = ("run-sigkill", "actor-sigkill", "api-sigkill", "run-sigterm", "ctrl-c")
#: Kinds after which the run goes on (Ray restarts the actor, keynes its temporary API); after the others it exits.
SURVIVABLE = {"actor-sigkill", "api-sigkill"}

#: Columns that say when or where a row was made, or what it cost, not what it is: left out of
#: every comparison (a shard's tokens evaluated depend on what its actor's KV cache held before).
TIMING_AND_PLACEMENT = {"latency_s", "seconds", "limit_wait_s", "committed_at", "computed_at", "created_at",
                        "started_at", "finished_at", "node", "worker", "tokens_evaluated", "tokens_bound"}
#: Further columns left out of one table: the experiment's config holds the ``db`` path
#: (its ``config_hash``, compared, covers everything that decides results).
LEFT_OUT = {"experiments": {"config"}}
#: Bookkeeping tables, not results; ``provenance`` has a row per arm and session that played it,
#: and an interrupted experiment is played by more sessions than an uninterrupted one.
NOT_RESULTS = {"schema_version", "provenance"}
#: The key of each table without a primary key (the others' keys are read from the schema).
KEYS = {
    "guesses": ("run_id", "round", "agent_id"),
    "winners": ("run_id", "round", "agent_id"),
    "group_winners": ("run_id", "round", "group_name", "agent_id"),
    "tau_fits": ("run_id", "round", "attribute", "value"),
}

#: The two experiments of the benchmark: (a) and (b).
EXPERIMENTS = {
    "simulated": {"agents": 100_000, "rounds": 5, "prompts": "basic,cot", "shard_size": 5_000, "latency": 0.5},
    "gemma": {"agents": 2_000, "rounds": 3, "prompts": "basic", "shard_size": 100, "latency": 0.0},
}


def keynes_command() -> list[str]:
    """The installed `keynes` script beside this interpreter, as users call it (else the module)."""
    script = Path(sys.executable).with_name("keynes")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.launch"]


def write_config(path: Path, args: argparse.Namespace) -> dict:
    """The experiment's config, written to ``path`` (YAML)."""
    engine = ({"kind": "simulated", "rule": "uniform", "latency_s": args.latency} if args.experiment == "simulated"
              else {"kind": "llamacpp", "shared_context": True})
    config = {
        "name": f"chaos-{args.experiment}",
        "seed": 11,
        "population": {"spec": "education.yaml", "size": args.agents},
        "game": {"ratio": "2/3", "rounds": args.rounds},
        "arms": {"engines": [engine], "prompts": args.prompts.split(",")},
        "workers": {"actors": args.actors, "shard_size": args.shard_size},
        "report": {"enabled": False},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config


# ---------------------------------------------------------------------------------------- runs
class Attempt:
    """One ``keynes run`` process, in its own process group as a terminal's foreground job."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.started = time.monotonic()
        with open(log, "w") as out:
            # As a terminal starts a foreground job: Ctrl-C not ignored (a benchmark started in a
            # script's background inherits SIGINT ignored, and Python keeps it so: the ctrl-c kind hung).
            self.popen = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.pid = self.popen.pid
        self.tag = tag_of(psutil.Process(self.pid))  # as cli.runtime.processes.guard sets it
        self.tagged_seen: set[int] = set()
        self.struck_at = 0.0  # seconds after its start of the last kill
        self.first_actor_s: float | None = None  # seconds after its start when its first actor ran
        self.wall_s = 0.0  # once it has completed

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def running(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def has_started(self) -> bool:
        """Whether its header line is printed: its guard has cleaned up after killed runs."""
        return re.search(r"\): [\d,]+ agents ×", self.output()) is not None

    def descendants(self) -> list[psutil.Process]:
        try:
            found = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []
        self.tagged_seen.update(p.pid for p in found if _carries(p, self.tag))
        if self.first_actor_s is None and any("ray::AgentWorker" in _cmdline(p) for p in found):
            self.first_actor_s = self.elapsed()
        return found

    def target(self, kind: str, rng: random.Random) -> psutil.Process | None:
        """The process a kill of ``kind`` hits now (None if it does not run yet)."""
        if kind in ("run-sigkill", "run-sigterm", "ctrl-c"):
            return psutil.Process(self.pid)
        marker = "ray::AgentWorker" if kind == "actor-sigkill" else "prefect.server.api.server:create_app"
        found = [p for p in self.descendants() if marker in _cmdline(p)]
        return rng.choice(found) if found else None

    def wait(self, timeout: float) -> int | None:
        """Its exit status, or None if it still runs after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _carries(proc: psutil.Process, tag: str) -> bool:
    try:
        return proc.environ().get(TAG) == tag
    except psutil.Error:
        return False


def strike(kind: str, attempt: Attempt, victim: psutil.Process) -> None:
    """Send the kill of ``kind``."""
    if kind == "ctrl-c":
        os.killpg(attempt.pid, signal.SIGINT)
    else:
        victim.send_signal(signal.SIGTERM if kind == "run-sigterm" else signal.SIGKILL)


def completed_run(command: list[str], env: dict[str, str], log: Path, timeout: float) -> Attempt:
    """An uninterrupted run (it notes when its first actor ran: its start-up)."""
    attempt = Attempt(command, env, log)
    deadline = time.monotonic() + timeout
    while attempt.running() and time.monotonic() < deadline:
        attempt.descendants()
        time.sleep(0.2)
    if attempt.wait(1) != 0:
        attempt.popen.kill()
        sys.exit(f"the uninterrupted run failed (exit {attempt.popen.returncode}):\n{attempt.output()[-3000:]}")
    attempt.wall_s = attempt.elapsed()
    return attempt


@dataclass
class Chaos:
    """What happened to the interrupted runs."""

    kills: Counter = field(default_factory=Counter)
    completed_before_kill: int = 0
    attempts: int = 0
    orphans: list[str] = field(default_factory=list)
    cleaned_at_start: int = 0
    tagged_seen: int = 0
    problems: list[str] = field(default_factory=list)
    exit_s: list[float] = field(default_factory=list)  # seconds each killed run took to exit
    wall_s: float = 0.0


def schedule(kills: int, kinds: list[str], rng: random.Random) -> list[str]:
    """``kills`` kinds: every kind in turn, each round of them in a shuffled order."""
    out: list[str] = []
    while len(out) < kills:
        batch = list(kinds)
        rng.shuffle(batch)
        out += batch
    return out[:kills]


def stored_fraction(db: Path, total: int) -> float:
    """The share of the experiment's guesses stored in ``db`` (0 before it exists)."""
    if not db.exists():
        return 0.0
    try:
        with duckdb.connect(str(db), read_only=True) as con:
            return con.execute("select count(*) from guesses").fetchall()[0][0] / total
    except duckdb.Error:
        return 0.0


def interrupted_runs(command: list[str], env: dict[str, str], workdir: Path, db: Path, total: int, reference: Attempt,
                     args: argparse.Namespace) -> Chaos:
    """Run ``command`` until it completes, striking it ``args.kills`` times at random moments.

    A run's expected length is its start-up (until its first actor runs: the last run's, else
    the reference's) plus the reference's play time scaled by the share of guesses still
    missing. Its kill's moment is drawn uniformly over the first ``args.window`` of that length
    divided by the kills still to come; after a kill it survives, the next one's over the same
    share of what is left (at least 3 s). At
    the moment the next kind of the schedule whose process runs strikes (an actor's only runs
    while rounds are played, Prefect's temporary API only in a run that started one).
    """
    rng = random.Random(args.seed)
    pending = schedule(args.kills, args.kinds.split(","), rng)
    startup_s = reference.first_actor_s or 0.0
    play_s = max(reference.wall_s - startup_s, 1.0)
    chaos = Chaos()
    start = time.monotonic()
    previous: Attempt | None = None
    while True:
        own_api = "PREFECT_API_URL" not in env or (pending and pending[0] == "api-sigkill")
        attempt_env = {k: v for k, v in env.items() if not (own_api and k == "PREFECT_API_URL")}
        expected = startup_s + play_s * (1 - stored_fraction(db, total))
        moment = rng.uniform(0, args.window * expected / max(1, len(pending)))
        chaos.attempts += 1
        attempt = Attempt(command, attempt_env, workdir / f"attempt-{chaos.attempts}.log")
        if previous is not None:
            check_orphans(previous, attempt, chaos)
        while True:
            kinds = [k for k in pending if k != "api-sigkill" or own_api]
            kind = run_until(attempt, kinds, moment, rng, (args.attempt_timeout, args.exit_timeout), chaos)
            if kind is None:
                break
            pending.remove(kind)
            chaos.kills[kind] += 1
            if kind not in SURVIVABLE:
                break
            print(f"  run {chaos.attempts}: {kind} at {attempt.struck_at:.1f} s; the run goes on", flush=True)
            moment = attempt.elapsed() + rng.uniform(0, args.window * max(expected - attempt.elapsed(), 3.0) / max(1, len(pending)))
        code = attempt.popen.returncode
        chaos.tagged_seen += len(attempt.tagged_seen)
        if code == 0:
            chaos.completed_before_kill += bool(pending)
            print(f"  run {chaos.attempts}: completed after {attempt.elapsed():.1f} s"
                  + (f", before its kill ({len(pending)} kill(s) left over)" if pending else ""), flush=True)
            check_leftovers(attempt, chaos)
            break
        if kind is None or kind in SURVIVABLE:
            chaos.problems.append(f"run {chaos.attempts} exited {code} without a kill that ends it:\n{attempt.output()[-2000:]}")
        chaos.exit_s.append(attempt.elapsed() - attempt.struck_at)
        print(f"  run {chaos.attempts}: {kind} at {attempt.struck_at:.1f} s, exit {code} {chaos.exit_s[-1]:.1f} s later; "
              f"{stored_fraction(db, total):.0%} of the guesses stored", flush=True)
        if chaos.attempts > args.kills + 5:
            chaos.problems.append("too many runs: they do not get anywhere")
            break
        previous = attempt
        startup_s = attempt.first_actor_s or startup_s
    chaos.wall_s = time.monotonic() - start
    return chaos


def run_until(attempt: Attempt, kinds: list[str], moment: float, rng: random.Random, timeouts: tuple[float, float],
              chaos: Chaos) -> str | None:
    """Watch ``attempt`` until it exits, or until ``moment`` when the first of ``kinds`` whose
    process runs strikes it: the kind that struck (None: it exited first).

    ``timeouts``: the seconds a run may last, and a struck run may take to exit.
    """
    timeout, exit_timeout = timeouts
    while attempt.running():
        attempt.descendants()  # note every process carrying its tag while it runs
        if attempt.elapsed() > timeout:
            chaos.problems.append(f"run {chaos.attempts} ran over {timeout:.0f} s: killed")
            attempt.popen.kill()
            break
        if kinds and attempt.elapsed() >= moment:
            for kind in kinds:
                victim = attempt.target(kind, rng)
                if victim is None:
                    continue
                try:
                    strike(kind, attempt, victim)
                except (psutil.Error, ProcessLookupError):
                    continue  # it ended a moment ago
                attempt.struck_at = attempt.elapsed()
                if kind not in SURVIVABLE:
                    if attempt.wait(exit_timeout) is None:
                        chaos.problems.append(f"run {chaos.attempts} did not exit within {exit_timeout:.0f} s of {kind}"
                                              + stacks(attempt.pid))
                        attempt.popen.kill()
                    attempt.popen.wait()
                return kind
        time.sleep(0.1)
    attempt.popen.wait()
    return None


def stacks(pid: int) -> str:
    """The Python stacks of every thread of ``pid`` (py-spy, when it is installed), to say where
    a run that does not end hangs; empty without py-spy."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return f"; its threads:\n{dump.stdout[-8000:]}" if dump.returncode == 0 else ""


def check_orphans(killed: Attempt, successor: Attempt, chaos: Chaos, wait_s: float = 120.0) -> None:
    """Once ``successor`` has started: the processes of ``killed`` that still run are orphans."""
    deadline = time.monotonic() + wait_s
    while successor.running() and not successor.has_started() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = tagged(killed.tag, set())
    for proc in left:
        chaos.orphans.append(f"{proc.pid} {_cmdline(proc)[:100]}")
    chaos.cleaned_at_start += sum(int(n) for n in re.findall(r"ended (\d+) process", successor.output()))


def check_leftovers(attempt: Attempt, chaos: Chaos, wait_s: float = 15.0) -> None:
    """A completed run leaves nothing running once its watchdog has had time to look."""
    deadline = time.monotonic() + wait_s
    while (left := tagged(attempt.tag, set())) and time.monotonic() < deadline:
        time.sleep(0.5)
    chaos.orphans += [f"{p.pid} {_cmdline(p)[:100]} (left by the completed run)" for p in left]


# ---------------------------------------------------------------------------------- comparison
def result_tables(con: duckdb.DuckDBPyConnection, catalog: str) -> dict[str, list[str]]:
    """Each results table of an attached warehouse and its compared columns, from the schema."""
    rows = con.execute(
        "select table_name, column_name from information_schema.columns where table_catalog = ? and table_schema = 'main' "
        "and table_name in (select table_name from information_schema.tables where table_catalog = ? and table_type = 'BASE TABLE') "
        "order by table_name, ordinal_position", [catalog, catalog]).fetchall()
    tables: dict[str, list[str]] = {}
    for table, column in rows:
        if table not in NOT_RESULTS and column not in TIMING_AND_PLACEMENT | LEFT_OUT.get(table, set()):
            tables.setdefault(table, []).append(column)
    return tables


def table_key(con: duckdb.DuckDBPyConnection, catalog: str, table: str) -> tuple[str, ...]:
    """The primary key of ``table``, else its key in ``KEYS``."""
    rows = con.execute("select constraint_column_names from duckdb_constraints() where database_name = ? "
                       "and table_name = ? and constraint_type = 'PRIMARY KEY'", [catalog, table]).fetchall()
    if rows:
        return tuple(rows[0][0])
    if table not in KEYS:
        raise SystemExit(f"table {table} has no primary key: add its key to KEYS in benchmarks/chaos.py")
    return KEYS[table]


def quoted(columns: list[str] | tuple[str, ...]) -> str:
    return ", ".join(f'"{c}"' for c in columns)


def table_hash(con: duckdb.DuckDBPyConnection, catalog: str, table: str, columns: list[str]) -> tuple[str, int]:
    """sha256 over the table's rows of ``columns``, sorted; and its row count."""
    digest, rows = hashlib.sha256(), 0
    result = con.execute(f'select {quoted(columns)} from {catalog}.main."{table}" order by all')
    while batch := result.fetchmany(10_000):
        rows += len(batch)
        for row in batch:
            digest.update(repr(row).encode())
    return digest.hexdigest(), rows


@dataclass
class Comparison:
    """Two warehouses side by side."""

    hashes: dict[str, str]
    tables: dict[str, tuple[int, int]]  # table → (reference rows, interrupted rows)
    differing: list[str]
    lost: int
    extra: int
    duplicated: dict[str, int]  # warehouse → rows duplicated


def compare(reference: Path, interrupted: Path) -> Comparison:
    """The content hashes, rows lost, extra and duplicated of ``interrupted`` against ``reference``."""
    con = duckdb.connect()
    con.execute(f"attach '{reference}' as ref (read_only)")
    con.execute(f"attach '{interrupted}' as got (read_only)")
    ref_tables, got_tables = result_tables(con, "ref"), result_tables(con, "got")
    digests = {"ref": hashlib.sha256(), "got": hashlib.sha256()}
    counts, differing, lost, extra = {}, [], 0, 0
    duplicated = {"ref": 0, "got": 0}
    for table in sorted(set(ref_tables) | set(got_tables)):
        columns = ref_tables.get(table)
        if columns != got_tables.get(table):
            differing.append(f"{table} (columns)")
            continue
        pair = []
        for catalog in ("ref", "got"):
            digest, rows = table_hash(con, catalog, table, columns)
            digests[catalog].update(f"{table}:{digest}\n".encode())
            pair.append((digest, rows))
            key = quoted(table_key(con, catalog, table))
            duplicated[catalog] += con.execute(f'select count(*) - count(distinct ({key})) from {catalog}.main."{table}"').fetchall()[0][0]
        counts[table] = (pair[0][1], pair[1][1])
        if pair[0][0] != pair[1][0]:
            differing.append(table)
        select = f'select {quoted(columns)} from {{}}.main."{table}"'
        lost += con.execute(f"select count(*) from ({select.format('ref')} except all {select.format('got')})").fetchall()[0][0]
        extra += con.execute(f"select count(*) from ({select.format('got')} except all {select.format('ref')})").fetchall()[0][0]
    con.close()
    return Comparison({c: d.hexdigest() for c, d in digests.items()}, counts, differing, lost, extra, duplicated)


# ---------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=sorted(EXPERIMENTS), default="simulated",
                        help="simulated: (a) 100,000 agents × 5 rounds × 2 arms; gemma: (b) 2,000 Gemma 3 270M agents × 3 rounds, shared context.")
    parser.add_argument("--agents", type=int, help="Agents (default: the experiment's).")
    parser.add_argument("--rounds", type=int, help="Rounds (default: the experiment's).")
    parser.add_argument("--prompts", help="Prompt modes, comma-separated: one arm each (default: the experiment's).")
    parser.add_argument("--shard-size", type=int, help="Agents per shard (default: the experiment's).")
    parser.add_argument("--latency", type=float, help="simulated: seconds per wave of the simulated server (default 0.5).")
    parser.add_argument("--actors", type=int, default=2, help="Ray actors.")
    parser.add_argument("--kills", type=int, default=20, help="Interruptions (K).")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"Kinds of kill, taken in turn: {', '.join(KINDS)}.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the kill moments, kinds and victims.")
    parser.add_argument("--window", type=float, default=0.5,
                        help="Kill moments are drawn over this first share of each run's expected length divided by the kills still to come (1: all of it; more runs then complete before their kill).")
    parser.add_argument("--attempt-timeout", type=float, default=3600, help="Seconds a run may take.")
    parser.add_argument("--exit-timeout", type=float, default=120, help="Seconds a killed run may take to exit.")
    parser.add_argument("--workdir", type=Path, help="Where the config, warehouses and logs go (default: a temporary folder, removed).")
    args = parser.parse_args(argv)
    for name, value in EXPERIMENTS[args.experiment].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(sorted(unknown))}; choose from {', '.join(KINDS)}")
    if min(args.agents, args.rounds, args.shard_size, args.actors) < 1 or args.kills < 0 or not 0 < args.window <= 1:
        parser.error("--agents, --rounds, --shard-size, --actors: at least 1; --kills: at least 0; --window: in (0, 1]")
    return args


def report(args: argparse.Namespace, ref_wall: float, chaos: Chaos, comparison: Comparison) -> bool:
    """Print the figures; True if the interrupted warehouse is the reference's and nothing was orphaned."""
    arms = len(args.prompts.split(","))
    print(f"experiment: {args.experiment}, {args.agents:,} agents × {args.rounds} rounds × {arms} arm(s), shards of "
          f"{args.shard_size:,}, {args.actors} actors" + (f", simulated latency {args.latency:g} s" if args.experiment == "simulated" else ""))
    kinds = ", ".join(f"{k} {chaos.kills[k]}" for k in KINDS if k in args.kinds.split(","))
    print(f"kills: {sum(chaos.kills.values())} of {args.kills} ({kinds}); runs: {chaos.attempts}; "
          f"completed before their kill: {chaos.completed_before_kill}")
    for table, (ref_rows, got_rows) in comparison.tables.items():
        print(f"  {table:22s} {ref_rows:>10,} rows reference {got_rows:>10,} rows interrupted")
    same = comparison.hashes["ref"] == comparison.hashes["got"] and not comparison.differing
    print(f"content hash, uninterrupted: {comparison.hashes['ref']}")
    print(f"content hash, interrupted:   {comparison.hashes['got']}")
    print(f"identical: {'yes' if same else 'no (' + ', '.join(comparison.differing) + ')'}")
    print(f"rows lost: {comparison.lost:,}; rows extra: {comparison.extra:,}; rows duplicated: {comparison.duplicated['got']:,} "
          f"(uninterrupted: {comparison.duplicated['ref']:,})")
    print(f"orphans: {len(chaos.orphans)} (processes carrying the run's tag seen: {chaos.tagged_seen}; "
          f"ended by the next start's cleanup: {chaos.cleaned_at_start})")
    for orphan in chaos.orphans:
        print(f"  orphan: {orphan}")
    print(f"wall: uninterrupted {ref_wall:.1f} s, interrupted {chaos.wall_s:.1f} s: {chaos.wall_s / ref_wall:.2f}x "
          f"(+{chaos.wall_s - ref_wall:.1f} s for {sum(chaos.kills.values())} kills)")
    if chaos.exit_s:
        print(f"killed runs exited {min(chaos.exit_s):.1f}–{max(chaos.exit_s):.1f} s after their kill")
    for problem in chaos.problems:
        print(f"problem: {problem}")
    return (same and comparison.lost == comparison.extra == 0 and comparison.duplicated["got"] == 0
            and not chaos.orphans and not chaos.problems)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="keynes-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        config = workdir / "chaos.yaml"
        write_config(config, args)
        total = args.agents * args.rounds * len(args.prompts.split(","))
        env = dict(os.environ)
        reference = workdir / "reference.duckdb"
        interrupted = workdir / "interrupted.duckdb"
        for db in (reference, interrupted):
            db.unlink(missing_ok=True)
        print(f"uninterrupted run: keynes run {config} --db {reference}", flush=True)
        ref = completed_run(keynes_command() + ["run", str(config), "--db", str(reference)], env,
                            workdir / "reference.log", args.attempt_timeout)
        print(f"  {ref.wall_s:.1f} s (first actor after {ref.first_actor_s or 0:.1f} s)", flush=True)
        print(f"interrupted runs: keynes run {config} --db {interrupted}, {args.kills} kills", flush=True)
        chaos = interrupted_runs(keynes_command() + ["run", str(config), "--db", str(interrupted)], env, workdir, interrupted,
                                 total, ref, args)
        ok = report(args, ref.wall_s, chaos, compare(reference, interrupted))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
