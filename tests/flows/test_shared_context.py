"""Shared-context answers through the whole flow on the real SmolLM2 135M Instruct (llama.cpp, chat
format): stored distributions and views, identical guesses and reasoning whatever the actor count
and shard size, and a round whose actor is killed mid-way ending with exactly the rows of an
uninterrupted run.

SmolLM2 rather than Gemma 3 270M: the flow's shared path is the same for both, and this module's
cost is answer-tree decodes, each a whole forward pass (measured here on one thread: 25 ms for
SmolLM2, 54 ms for Gemma, whose 262k-token output layer is five times SmolLM2's). Gemma plays the
shared path through the flow in the session's quickstart run and in tests/engines/.

Two flows (one actor playing whole rounds; two actors on shards of 4), each with a basic and a
chain-of-thought arm on the same actors, serve every test; the killed round replays round 2 of the
second flow. Model loads: 1 + 2 for the flows, 2 + 1 (the restart) for the killed round.
"""

from __future__ import annotations

import os
import shutil
import signal

import duckdb
import polars as pl
import pytest

from design.loading import load_config
from flows.experiment import experiment
from tasks.play import play_round
from tasks.pool import pool_for, shutdown_pools
from tests.reliability.test_worker_crash import CountingWarehouse
from tests.support.sql import q

pytestmark = pytest.mark.llm

N = 10  # 2 agents per education level
ONE, TWO = (1, 500), (2, 4)  # (actors, shard size): whole rounds on one actor; 3 shards a round on two


def config(actors: int, shard_size: int) -> dict:
    return {
        "name": "shared",
        "seed": 5,
        "population": {"spec": "education.yaml", "size": N},
        # Numbers from 0 to 10: every property tested here holds for any range, and each distinct
        # prompt's answer tree is 11 answers instead of 101 (the 0-100 tree plays through the flow
        # in the session's quickstart run).
        "game": {"ratio": "2/3", "rounds": 2, "high": 10},
        # 2 actors × 0.5 CPUs fit the 2-core machine (Ray is told its real CPU count). The two
        # modes' arms share the engine, so they play on the same actors one after the other.
        "arms": {"engines": [{"kind": "llamacpp", "model": "smollm2-135m-instruct", "num_cpus": 0.5}], "prompts": ["basic", "cot"],
                 "max_reasoning_tokens": 12},
        "workers": {"actors": actors, "shard_size": shard_size},
        "report": {"enabled": False},
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_api, local_ray):
    root = tmp_path_factory.mktemp("shared")
    out = {}
    for actors, shard_size in (ONE, TWO):
        path = root / f"a{actors}-s{shard_size}.duckdb"
        summary = experiment(config(actors, shard_size), db=str(path))
        shutdown_pools()
        assert summary.complete and summary.rows_written == 2 * 2 * N
        out[(actors, shard_size)] = path
    return out


ROWS = """select r.prompt_mode, g.round, g.agent_id, g.reasoning, g.raw, g.guess, g.completion_tokens, g.prompt_tokens, g.context
          from guesses g join runs r using (run_id) order by r.prompt_mode, g.round, g.agent_id"""


def test_the_same_config_gives_identical_guesses_and_reasoning_with_1_or_2_actors_and_shards_of_500_or_4(runs):
    """Reasoning is decoded many agents at a time, each in its own KV stream, and every answer is drawn
    from its own prompt's distribution: an agent's text and answer depend on its prompt and seed, not
    on who shares its batch, shard or actor."""
    one, two = q(runs[ONE], ROWS), q(runs[TWO], ROWS)
    assert len(one) == 2 * 2 * N and one == two
    cot = [row for row in one if row[0] == "cot"]
    assert sum(bool(row[3].strip()) for row in cot) >= len(cot) - 2  # the reasoning is there, stored
    assert q(runs[TWO], "select count(distinct worker) from shards") == [(2,)]
    # One shard per arm and round on one actor; ceil(10 / 4) = 3 shards per arm and round on two.
    assert q(runs[ONE], "select count(*) from shards") == [(4,)] and q(runs[TWO], "select count(*) from shards") == [(12,)]


def test_every_guess_is_shared_valid_and_counts_its_prompt(runs):
    path = runs[TWO]
    assert q(path, "select count(*), count(*) filter (where valid and shared_prompt and context is not null) from guesses") == [(4 * N, 4 * N)]
    assert q(path, "select min(prompt_tokens) > 40, min(completion_tokens) >= 1 from guesses") == [(True, True)]
    basic = "(select run_id from runs where prompt_mode = 'basic')"
    # Round 1: one group per education level. Round 2 adds each agent's own first guess to its
    # prompt: one group per (level, first guess) pair, counted here from the stored guesses.
    assert q(path, f"select count(distinct context) from guesses where round = 1 and run_id = {basic}") == [(5,)]
    pairs = q(path, f"""select count(*) from (select distinct p.education, g.guess from guesses g join personas p using (agent_id)
                                             where g.round = 1 and g.run_id = {basic})""")
    assert q(path, f"select count(distinct context) from guesses where round = 2 and run_id = {basic}") == pairs
    assert pairs[0][0] > 5
    # Round 1's five prompts were answered ahead of its shards, by the two actors between them
    # (tasks.play.answer_ahead, engines.shared_context.board), their tokens counted in each actor's first shard:
    # the third shard (the first actor's second) only drew.
    work = q(path, f"select shard, tokens_evaluated, tokens_bound from shards where round = 1 and run_id = {basic} order by shard")
    assert [s for s, _, _ in work] == [0, 1, 2] and work[2][1] == 0
    assert sum(e for _, e, _ in work) >= sum(b for _, _, b in work) > 0


def test_distributions_are_stored_with_their_agents_and_sum_to_one(runs):
    path = runs[TWO]
    # Per shard: each group's distribution sums to 1, and the groups count every agent of the round once.
    bad = q(path, """select count(*) from (select run_id, round, shard, context, sum(probability) as p
                                           from answer_distributions group by all) where abs(p - 1) > 1e-6""")
    assert bad == [(0,)]
    assert q(path, """select distinct n from (select run_id, round, sum(agents) as n from
                      (select distinct run_id, round, shard, context, agents from answer_distributions) group by all)""") == [(N,)]
    # Every drawn answer has a positive probability in its group's distribution.
    assert q(path, """select count(*) from guesses g left join answer_distributions d
                      on d.run_id = g.run_id and d.round = g.round and d.shard = g.shard and d.context = g.context and d.answer = g.raw
                      where d.probability is null or d.probability <= 0""") == [(0,)]
    # The same prompt in different shards has the same distribution (a function of the prompt alone).
    assert q(path, """select max(hi - lo) < 1e-12 from (select context, answer, max(probability) as hi, min(probability) as lo
                      from answer_distributions group by all)""") == [(True,)]


def test_exact_answers_by_attribute_match_an_independent_mixture(runs):
    """A level's expected answer is the mean, over its agents, of the expected answer of each agent's
    own prompt. Computed here from the stored tables, for both arms and rounds: in round 2 and in the
    chain-of-thought arm, agents of one level have different prompts, so the mixture is a real one."""
    path = runs[TWO]
    view = q(path, """select prompt_mode, round, value, agents, expected, entropy_bits, total_probability
                      from exact_answers_by_attribute where attribute = 'education' order by all""")
    assert len(view) == 2 * 2 * 5 and all(r[3] == N // 5 for r in view)
    assert all(abs(r[6] - 1) < 1e-6 and 0 <= r[5] <= 7 for r in view)
    with duckdb.connect(str(path), read_only=True) as con:
        dists = pl.from_arrow(con.sql("select run_id, shard, context, answer, probability from answer_distributions").to_arrow_table())
        agents = pl.from_arrow(con.sql("""select r.prompt_mode, g.run_id, g.round, g.context, p.education
                                          from guesses g join runs r using (run_id) join personas p using (agent_id)""").to_arrow_table())
    # One shard's copy of each distribution (they agree across shards, tested above).
    first = dists.filter(pl.col("shard") == pl.col("shard").min().over("run_id", "context"))
    means = first.group_by("run_id", "context").agg((pl.col("probability") * pl.col("answer").cast(pl.Float64)).sum().alias("mean"))
    mixture = agents.join(means, on=["run_id", "context"]).group_by("prompt_mode", "round", "education").agg(
        pl.col("mean").mean(), pl.col("context").n_unique().alias("groups"))
    want = {(r["prompt_mode"], r["round"], r["education"]): r["mean"] for r in mixture.iter_rows(named=True)}
    assert len(want) == len(view)
    for mode, round_, value, _, expected, _, _ in view:
        assert expected == pytest.approx(want[(mode, round_, value)], rel=1e-9), (mode, round_, value)
    assert mixture.filter((pl.col("prompt_mode") == "basic") & (pl.col("round") == 2) & (pl.col("groups") > 1)).height > 0


class KillingWarehouse(CountingWarehouse):
    """The counting warehouse that SIGKILLs one actor's process when the round's first results
    arrive, before committing them. The round cannot be over then: the driver has just handed the
    freed actors the next shards (``run_pools`` submits before it commits), so the victim is playing."""

    def __init__(self, path, victim_pid: int):
        super().__init__(path)
        self.victim_pid = victim_pid

    def write_shards(self, shards):
        if not self.commits:
            os.kill(self.victim_pid, signal.SIGKILL)
        return super().write_shards(shards)


def test_a_round_whose_actor_is_killed_mid_way_ends_with_the_rows_of_an_uninterrupted_run(runs, tmp_path, local_ray):
    """Round 2 of the basic arm, where each agent's prompt is its own, replayed in shards of 3 on
    two actors, one of them killed mid-round: the actor comes back as a new process and plays the
    lost shards, and the round ends with exactly the rows and distributions the flow stored."""
    import ray

    reference = runs[TWO]
    path = tmp_path / "killed.duckdb"
    shutil.copy(reference, path)
    cfg = load_config(config(*TWO), [f"db={path}"])
    arm = next(a for a in cfg.arms_list() if a.prompt_mode == "basic")
    with duckdb.connect(str(path)) as con:  # round 2 of this arm unplayed again; round 1 stays
        for table in ("guesses", "shards", "answer_distributions"):
            con.execute(f"delete from {table} where run_id = ? and round = 2", [arm.run_id])
    shards = -(-N // 3)
    pool = pool_for(arm.engine, 2)  # the pool play_round will use: min(2 actors, 4 shards)
    try:
        before = ray.get([a.where.remote() for a in pool.actors])
        warehouse = KillingWarehouse(path, before[0]["pid"])
        personas = warehouse.read_personas(cfg.experiment_id)
        assert personas.height == N
        played = play_round.fn(arm, 2, cfg.seed, personas, warehouse, 2, 3)
        after = ray.get([a.where.remote() for a in pool.actors])
    finally:
        shutdown_pools()

    # The kill came with the first commit and the round went on after it; the victim is a new
    # process now (the other actor is not), and that new process committed shards of the round.
    assert len(warehouse.commits) >= 2 and warehouse.shards_committed == shards
    assert after[0]["pid"] != before[0]["pid"] and after[1]["pid"] == before[1]["pid"]
    workers = {w for (w,) in q(path, "select distinct worker from shards where run_id = ? and round = 2", [arm.run_id])}
    assert after[0]["worker"] in workers
    # Each shard committed once, with all of its agents: nothing lost, nothing doubled.
    assert sorted(s for batch, _, _, _ in warehouse.commits for s in batch) == list(range(shards))
    assert all(new == sent for _, new, sent, _ in warehouse.commits)
    assert played.written == N and played.shards == shards
    assert q(path, "select count(*), sum(n) from shards where run_id = ? and round = 2", [arm.run_id]) == [(shards, N)]
    # Exactly the uninterrupted round: the same rows, and the same distribution for each group.
    rows = "select agent_id, raw, guess, valid, shared_prompt, prompt_tokens, completion_tokens, context from guesses where run_id = ? and round = 2 order by agent_id"
    assert q(path, rows, [arm.run_id]) == q(reference, rows, [arm.run_id])
    dist = "select context, answer, min(probability), max(probability) from answer_distributions where run_id = ? and round = 2 group by all order by all"
    killed, uninterrupted = q(path, dist, [arm.run_id]), q(reference, dist, [arm.run_id])
    assert [r[:2] for r in killed] == [r[:2] for r in uninterrupted]
    assert all(abs(k[2] - u[2]) < 1e-12 and abs(k[3] - k[2]) < 1e-12 for k, u in zip(killed, uninterrupted))
    # One distribution per group and shard, none doubled by the replayed shards.
    assert q(path, "select sum(agents) from (select distinct shard, context, agents from answer_distributions where run_id = ? and round = 2)",
             [arm.run_id]) == [(N,)]
    assert q(path, "select count(*) from (select shard, context, answer, count(*) c from answer_distributions group by all having c > 1)") == [(0,)]
