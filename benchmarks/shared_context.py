"""Shared-context answers against the per-agent path, side by side, on Gemma 3 270M (llama.cpp).

(a) round 1, education population, basic mode: N agents on the shared path; the per-agent path
    on a subsample of the same prompts (its cost is linear in agents); answers/s, CPU s, ratio.
(b) a 3-round basic-mode experiment through ``keynes run``, shared vs ``shared_context=false``.
(c) chain of thought, both paths: one by one, against reasoning decoded many agents at a time
    with each answer drawn in its agent's own KV stream.
(d) N agents, round 1, through ``keynes run`` (shared): wall time and peak memory.
(e) the paper's five-round game (experiments/paper/five_rounds.yaml: 2/3 and 5 + x/2) through
    ``keynes run``, shared vs ``shared_context=false``; per round of the shared run: distinct
    prompts, tokens evaluated per decision and the lower bound (the trie of each shard's distinct
    prompts plus one token per answer-tree node), from the ``shards`` table; then the ratio the
    shared path could reach at that bound (benchmarks/decode_shapes.py: what a token costs).

    uv run --extra llamacpp python benchmarks/shared_context.py --sections a,c
    uv run --extra llamacpp python benchmarks/shared_context.py --sections b --agents 1000
    uv run --extra llamacpp python benchmarks/shared_context.py --sections d --agents 1000000
    uv run --extra llamacpp python benchmarks/shared_context.py --sections e --agents 1000 --per-agent 100
    uv run --extra llamacpp python benchmarks/shared_context.py --sections e --set game.history.own_guesses=false

``--set key=value`` (repeatable) goes to every ``keynes run`` of (b), (d) and (e), on both paths: for
example (e) under another ``game.history``, which sets how many distinct prompts a round has.
(b) and (d) start a local Ray per run, as a user's ``keynes run`` does; ``--ray-address`` joins a
running Ray instead (a cluster, or a Ray kept up between runs: the figures then leave its start out).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from core.game import GameRule  # noqa: E402
from core.seeds import sampling_seeds  # noqa: E402
from engines import Constraint, RequestBatch, Sampling  # noqa: E402
from populations.sampler import sample  # noqa: E402
from populations.spec import load_spec  # noqa: E402
from prompts.context import agent_variables, game_context  # noqa: E402
from prompts.modes import FINAL_CUE  # noqa: E402
from prompts.render import render  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RULE = GameRule()
CONSTRAINT = Constraint(RULE.low, RULE.high, RULE.integer)


def workload(n: int, template: str = "basic.j2") -> RequestBatch:
    personas = sample(load_spec("education.yaml"), n, seed=1)
    shared = {"game": game_context(RULE, n), "round": 1, "history": []}
    prompts = render(template, shared, agent_variables(personas))
    ids = personas["agent_id"].to_numpy().astype(np.int64)
    seeds = sampling_seeds(1, ids, 1)
    return RequestBatch(ids, prompts, seeds, Sampling(0.7, 8), CONSTRAINT)


def subsample(batch: RequestBatch, m: int) -> RequestBatch:
    idx = np.linspace(0, len(batch) - 1, m).astype(int)
    return RequestBatch(batch.agent_id[idx], [batch.prompt[i] for i in idx], batch.seed[idx], batch.sampling, batch.constraint)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def row(label: str, answers: int, wall: float, cpu: float) -> float:
    rate = answers / wall
    print(f"  {label:34s} {answers:>9,} answers {wall:8.1f} s  {rate:10.1f} answers/s  {cpu / answers * 1000:8.2f} ms CPU/answer")
    return rate


def engine(shared: bool, threads: int, sequences: int | None = None):
    from engines.llamacpp import LlamaCppEngine, LlamaCppSpec

    extra = {"sequences": sequences} if sequences else {}
    return LlamaCppEngine(LlamaCppSpec(n_threads=threads, shared_context=shared, **extra))


def section_a(n: int, per_agent_n: int, threads: int) -> None:
    print(f"(a) round 1, education, basic: {n:,} agents shared, {per_agent_n} per agent (same prompts)")
    batch = workload(n)
    shared, per_agent = engine(True, threads), engine(False, threads)
    _, w1, c1 = timed(lambda: per_agent.generate(subsample(batch, per_agent_n)))
    _, w2, c2 = timed(lambda: shared.generate(batch))
    r1 = row("per-agent path", per_agent_n, w1, c1)
    r2 = row("shared-context path", n, w2, c2)
    ratio = r2 / r1  # thousands at the default sizes; near 1 at a few agents, where 0 decimals would print 0x
    print(f"  ratio shared / per-agent: {ratio:,.0f}x answers/s" if ratio >= 10 else f"  ratio shared / per-agent: {ratio:.2f}x answers/s")


def section_c(n: int, threads: int, max_reasoning: int = 48) -> None:
    print(f"(c) chain of thought, {n} agents, at most {max_reasoning} reasoning tokens (as the flow runs it: Engine.reason_and_answer)")
    batch = workload(n, "cot.j2")
    free = RequestBatch(batch.agent_id, batch.prompt, batch.seed, Sampling(0.7, max_reasoning), None)
    rates = []
    for label, shared, slots in (("per-agent path", False, None), ("shared, sequences 8 (default)", True, 8), ("shared, sequences 32", True, 32)):
        e = engine(shared, threads, slots)
        _, wall, cpu = timed(lambda e=e: e.reason_and_answer(free, batch, FINAL_CUE))
        rates.append(row(label, n, wall, cpu))
        e.close()
    print(f"  ratio: {rates[1] / rates[0]:.2f}x decisions/s (sequences 8), {rates[2] / rates[0]:.2f}x (sequences 32)")


#: Per round of a stored run: decisions, distinct prompts, tokens evaluated and their bound (NULL
#: where not counted: the per-agent path).
ROUND_WORK = """
    select g.round, count(*) as decisions, count(distinct g.context) as prompts,
           (select sum(tokens_evaluated) from shards s where s.round = g.round) as evaluated,
           (select sum(tokens_bound) from shards s where s.round = g.round) as bound
    from guesses g group by g.round order by g.round
"""


def keynes_run(n: int, rounds: int, shared: bool, shard_size: int, actors: int, ray_address: str | None,
               config: str = "experiments/quickstart.yaml", prompts: str | None = "[basic]", work: list | None = None,
               sets: tuple[str, ...] = (), query: str = ROUND_WORK) -> tuple[float, float, float]:
    """Wall seconds, peak memory (GiB, summed RSS of ``keynes run`` and every process it starts:
    Ray, the actors, Prefect's API) and their CPU seconds, of one ``keynes run`` of ``config``
    (which joins ``ray_address`` if given, else starts a local Ray). ``work``: filled with the
    rows of ``query`` on the run's warehouse (default ``ROUND_WORK``); ``sets``: more
    ``--set key=value`` overrides, applied last (``arms.engines=[...]`` replaces the llama.cpp engine)."""
    from benchmarks.scale import MemorySampler

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "cli.app", "run", str(REPO / config), "--db", f"{tmp}/b.duckdb",
               "--set", f"population.size={n}", "--set", f"game.rounds={rounds}",
               "--set", f"workers.shard_size={shard_size}", "--set", f"workers.actors={actors}",
               "--set", f"arms.engines=[{{kind: llamacpp, shared_context: {str(shared).lower()}}}]",
               "--set", "report.enabled=false"]
        if prompts:
            cmd += ["--set", f"arms.prompts={prompts}"]
        if ray_address:
            cmd += ["--set", f"workers.ray_address={ray_address}"]
        for override in sets:
            cmd += ["--set", override]
        with MemorySampler() as sampler:
            sampler.reset()
            start = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
            wall = time.perf_counter() - start
        import duckdb

        with duckdb.connect(f"{tmp}/b.duckdb", read_only=True) as con:
            rows, valid = con.execute("select count(*), count(guess) from guesses").fetchall()[0]
            if work is not None:
                work += con.execute(query).fetchall()
        print(f"  guesses stored: {rows:,} ({valid:,} valid)")
    return wall, sampler.peak / 2**30, sampler.cpu_s


def section_b(n: int, per_agent_n: int, actors: int, ray_address: str | None, sets: tuple[str, ...] = ()) -> None:
    print(f"(b) 3 rounds, basic, through keynes run: {n:,} agents shared, {per_agent_n:,} per agent{_with(sets)}")
    w1, _, c1 = keynes_run(per_agent_n, 3, False, max(1, per_agent_n // 4), actors, ray_address, sets=sets)
    w2, _, c2 = keynes_run(n, 3, True, max(1, n // 4), actors, ray_address, sets=sets)
    r1, r2 = 3 * per_agent_n / w1, 3 * n / w2
    print(f"  per-agent {3 * per_agent_n:,} decisions {w1:.1f} s = {r1:.2f}/s ({c1:.0f} CPU s); "
          f"shared {3 * n:,} decisions {w2:.1f} s = {r2:.2f}/s ({c2:.0f} CPU s); ratio {r2 / r1:.1f}x")


def section_d(n: int, actors: int, ray_address: str | None, sets: tuple[str, ...] = ()) -> None:
    starts = "joins the running Ray; Prefect's start" if ray_address else "Ray and Prefect start"
    print(f"(d) round 1 through keynes run, {n:,} agents, shared (whole command: {starts}, personas, actors, DuckDB){_with(sets)}")
    wall, peak, cpu = keynes_run(n, 1, True, max(1, n // 8), actors, ray_address, sets=sets)
    print(f"  wall {wall:.1f} s, {n / wall:,.0f} decisions/s, peak memory {peak:.2f} GiB (every process), {cpu:.0f} CPU s")


def section_e(n: int, per_agent_n: int, actors: int, ray_address: str | None, rounds: int = 5,
              sets: tuple[str, ...] = ()) -> None:
    config = "experiments/paper/five_rounds.yaml"
    print(f"(e) the paper's five-round game, {rounds} rounds ({config}: 2/3 and 5 + x/2, basic), through keynes run: "
          f"{n:,} agents shared, {per_agent_n:,} per agent{_with(sets)}")
    w1, _, c1 = keynes_run(per_agent_n, rounds, False, max(1, per_agent_n // 4), actors, ray_address, config, None, sets=sets)
    work: list = []
    w2, _, c2 = keynes_run(n, rounds, True, max(1, n // 4), actors, ray_address, config, None, work, sets=sets)
    arms = 2
    d1, d2 = arms * rounds * per_agent_n, arms * rounds * n
    r1, r2 = d1 / w1, d2 / w2
    print(f"  per-agent {d1:,} decisions {w1:.1f} s = {r1:.2f}/s ({c1:.0f} CPU s); "
          f"shared {d2:,} decisions {w2:.1f} s = {r2:.2f}/s ({c2:.0f} CPU s); ratio {r2 / r1:.1f}x")
    print("  shared, per round: decisions, distinct prompts, tokens evaluated per decision, lower bound per decision, evaluated / bound")
    for round_, decisions, distinct, evaluated, bound in work:
        print(f"    round {round_}: {decisions:>9,} {distinct:>9,} {evaluated / decisions:>9.2f} {bound / decisions:>9.2f} "
              f"{evaluated / bound:>6.2f}x")
    evaluated, bound = sum(w[3] for w in work), sum(w[4] for w in work)
    if evaluated and bound:
        # The most the shared path could gain by evaluating only the bound: this run's CPU a decision, scaled
        # by the tokens it would save (as if all of it were token work: an upper bound on the gain).
        per_agent_ms, shared_ms = c1 / d1 * 1000, c2 / d2 * 1000
        at_bound = shared_ms * bound / evaluated
        print(f"  at the trie bound ({bound / evaluated:.2f} of the tokens evaluated): {at_bound:.1f} ms CPU a decision "
              f"against the per-agent path's {per_agent_ms:.1f} ms, a ratio of at most {per_agent_ms / at_bound:.1f}x")


def _with(sets: tuple[str, ...]) -> str:
    return "".join(f", --set {s}" for s in sets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="a,c", help="a,b,c,d,e")
    parser.add_argument("--agents", type=int, default=20_000)
    parser.add_argument("--per-agent", type=int, default=500, help="agents of the per-agent side")
    parser.add_argument("--cot-agents", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--actors", type=int, default=2, help="keynes run's actors in (b) and (d)")
    parser.add_argument("--ray-address", help="(b), (d) and (e) join this Ray instead of starting one per run")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of (e): the paper's 5 by default")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for every keynes run of (b), (d) and (e), both paths (repeatable)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for s in args.sections.split(","):
        if s == "a":
            section_a(args.agents, args.per_agent, args.threads)
        elif s == "b":
            section_b(args.agents, args.per_agent, args.actors, args.ray_address, tuple(args.sets))
        elif s == "c":
            section_c(args.cot_agents, args.threads)
        elif s == "d":
            section_d(args.agents, args.actors, args.ray_address, tuple(args.sets))
        elif s == "e":
            section_e(args.agents, args.per_agent, args.actors, args.ray_address, args.rounds, tuple(args.sets))


if __name__ == "__main__":
    main()
