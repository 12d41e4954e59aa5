"""Shared-context answers through the whole flow on the real Gemma 3 270M: stored distributions and
views, identical guesses whatever the actor count and shard size, one row per agent after a kill."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from core.arms import Arm
from core.game import GameRule
from engines.llamacpp import LlamaCppSpec
from flows.experiment import experiment
from populations.sampler import sample
from populations.spec import load_spec
from tasks.play import play_round, pool_for, shutdown_pools
from tests.reliability.test_worker_crash import CountingWarehouse
from tests.support.sql import q

pytestmark = pytest.mark.llm

N = 40


def config(actors: int, shard_size: int) -> dict:
    return {
        "name": "shared",
        "seed": 5,
        "population": {"spec": "education.yaml", "size": N},
        "game": {"ratio": "2/3", "rounds": 2},
        # 3 actors × 0.5 CPUs fit the 2-core machine (Ray is told its real CPU count).
        "arms": {"engines": [{"kind": "llamacpp", "num_cpus": 0.5}], "prompts": ["basic"]},
        "workers": {"actors": actors, "shard_size": shard_size},
    }



@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_api, local_ray):
    root = tmp_path_factory.mktemp("shared")
    out = {}
    for actors, shard_size in [(1, 500), (3, 7)]:
        path = root / f"a{actors}-s{shard_size}.duckdb"
        experiment(config(actors, shard_size), db=str(path))
        shutdown_pools()
        out[(actors, shard_size)] = path
    return out


GUESSES = "select round, agent_id, raw, guess, completion_tokens, prompt_tokens, context from guesses order by round, agent_id"


def cot_config(actors: int, shard_size: int) -> dict:
    base = config(actors, shard_size)
    return {**base, "name": "shared-cot", "population": {"spec": "education.yaml", "size": 20}, "game": {"ratio": "2/3", "rounds": 1},
            "arms": {**base["arms"], "prompts": ["cot"], "max_reasoning_tokens": 24}}


def test_chain_of_thought_gives_identical_guesses_with_1_or_3_actors_and_shards_of_500_or_7(tmp_path, prefect_api, local_ray):
    """Reasoning decoded many agents at a time, each answer in its agent's own KV stream: an
    agent's text and answer depend on its prompt and seed, not on who shares its batch."""
    rows = {}
    for actors, shard_size in [(1, 500), (3, 7)]:
        path = tmp_path / f"cot-a{actors}-s{shard_size}.duckdb"
        experiment(cot_config(actors, shard_size), db=str(path))
        shutdown_pools()
        rows[actors] = q(path, "select agent_id, reasoning, raw, guess, prompt_tokens, completion_tokens, context from guesses order by agent_id")
        assert q(path, "select count(*), count(guess), count(context) from guesses")[0] == (20, 20, 20)
    assert rows[1] == rows[3]
    assert sum(bool(r[1].strip()) for r in rows[1]) >= 18


def test_the_same_config_gives_identical_guesses_with_1_or_3_actors_and_shards_of_500_or_7(runs):
    one, three = runs[(1, 500)], runs[(3, 7)]
    a, b = q(one, GUESSES), q(three, GUESSES)
    assert len(a) == 2 * N and a == b
    assert q(three, "select count(distinct worker) from shards")[0][0] == 3
    assert q(one, "select count(*) from shards") == [(2,)] and q(three, "select count(*) from shards") == [(12,)]


def test_every_guess_is_shared_valid_and_counts_its_prompt(runs):
    path = runs[(3, 7)]
    assert q(path, "select count(*), count(*) filter (where valid and shared_prompt and context is not null), "
                   "min(prompt_tokens), min(completion_tokens) from guesses")[0][:2] == (2 * N, 2 * N)
    assert q(path, "select min(prompt_tokens) > 40, min(completion_tokens) >= 1 from guesses") == [(True, True)]
    # Round 1: one group per education level; round 2 adds each agent's own first guess.
    assert q(path, "select count(distinct context) from guesses where round = 1") == [(5,)]
    assert q(path, "select count(distinct context) >= 5 from guesses where round = 2") == [(True,)]


def test_distributions_are_stored_with_their_agents_and_sum_to_one(runs):
    path = runs[(3, 7)]
    # Per shard: each group's distribution sums to 1 and counts the shard's agents of that group.
    bad = q(path, """select count(*) from (select run_id, round, shard, context, sum(probability) as p, any_value(agents) as n
                                           from answer_distributions group by all) where abs(p - 1) > 1e-6""")
    assert bad == [(0,)]
    assert q(path, """select sum(n) from (select shard, context, any_value(agents) as n from answer_distributions
                                          where round = 1 group by all)""") == [(N,)]
    # Every drawn answer has a positive probability in its group's distribution.
    assert q(path, """select count(*) from guesses g left join answer_distributions d
                      on d.run_id = g.run_id and d.round = g.round and d.shard = g.shard and d.context = g.context and d.answer = g.raw
                      where d.probability is null or d.probability <= 0""") == [(0,)]
    # The same prompt in different shards has the same distribution (a function of the prompt alone).
    assert q(path, """select max(hi - lo) < 1e-12 from (select context, answer, max(probability) as hi, min(probability) as lo
                      from answer_distributions group by all)""") == [(True,)]


def test_exact_answers_by_attribute_matches_an_independent_mixture(runs):
    path = runs[(3, 7)]
    rows = q(path, """select round, value, agents, expected, entropy_bits, mode, total_probability
                      from exact_answers_by_attribute where attribute = 'education' order by round, value""")
    assert len(rows) == 2 * 5 and all(r[2] == N // 5 for r in rows)
    assert all(abs(r[6] - 1) < 1e-6 and 0 <= r[4] <= 7 for r in rows)
    # Round 1: every agent of a level shares one prompt, so the mixture is that prompt's distribution.
    direct = dict(q(path, """select p.education, sum(d.probability * d.value) from exact_answers d
                             join (select distinct context, p.education from guesses g join personas p using (agent_id)
                                   where g.round = 1) p using (context)
                             where d.round = 1 group by all"""))
    for round_, value, _, expected, _, _, _ in rows:
        if round_ == 1:
            assert expected == pytest.approx(direct[value] / 1, rel=1e-9)


def test_a_killed_actor_mid_round_still_ends_with_one_row_per_agent(db, local_ray):
    import ray

    # Persona prompts with ages: every agent's prompt is distinct, so each shard computes its own.
    spec = LlamaCppSpec(num_cpus=1)
    arm = Arm(0, "kill-arm0", spec, "basic", 0.7, GameRule(rounds=1))
    personas = sample(load_spec("adults.yaml"), 24, seed=3).drop("name", strict=False)
    warehouse = CountingWarehouse(db)
    pool = pool_for(spec, 2)
    victim = pool.actors[0]
    victim_pid = ray.get(victim.where.remote())["pid"]
    killed: dict[str, int] = {}

    def kill_after_two_commits() -> None:
        deadline = time.monotonic() + 600
        while len(warehouse.commits) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        killed["after"] = len(warehouse.commits)
        os.kill(victim_pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_after_two_commits)
    killer.start()
    try:
        played = play_round.fn(arm, 1, 11, personas, warehouse, 2, 3)
    finally:
        killer.join()
        shutdown_pools()
    assert killed["after"] < 8, "the round ended before the kill"
    assert played["written"] == 24
    assert q(db, "select count(*), count(distinct agent_id), count(*) filter (where valid and shared_prompt) from guesses") == [(24, 24, 24)]
    assert q(db, "select count(*), sum(n) from shards") == [(8, 24)]
    # One distribution per group and shard, none doubled by the replayed shard.
    assert q(db, "select sum(agents) from (select distinct shard, context, agents from answer_distributions)") == [(24,)]
    assert q(db, "select count(*) from (select shard, context, answer, count(*) c from answer_distributions group by all having c > 1)") == [(0,)]
