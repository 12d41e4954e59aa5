"""A mixture of engines in one game: quota split, stable per agent, each row names its engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from design.config import ConfigError
from design.loading import load_config
from engines.mixture import MixtureSpec, shard_index
from flows.experiment import experiment
from tests.support.sql import q

# Two simulated servers told apart by their latency: 0.05 s per wave vs instant.
MIXTURE = {
    "kind": "mixture",
    "components": [
        {"fraction": 0.7, "engine": {"kind": "simulated", "latency_s": 0.05, "concurrency": 5}},
        {"fraction": 0.3, "engine": {"kind": "simulated", "concurrency": 1000}},
    ],
}
CONFIG = {
    "name": "mixture",
    "seed": 9,
    "population": {"spec": "education.yaml", "size": 101},
    "game": {"rounds": 3},
    "arms": {"engines": [MIXTURE], "prompts": ["basic"]},
    "workers": {"actors": 2, "shard_size": 20},
    "report": {"enabled": False},
}



@pytest.fixture(scope="module")
def mixture_db(tmp_path_factory, prefect_api, local_ray):
    path = tmp_path_factory.mktemp("mixture") / "mixture.duckdb"
    experiment(CONFIG, db=str(path))
    return path


def test_agents_are_split_by_quota_and_keep_their_engine(mixture_db):
    slow = "latency_s > 0"
    per_round = q(mixture_db, f"select round, count(*) filter ({slow}), count(*) from guesses group by all order by 1")
    assert per_round == [(1, 71, 101), (2, 71, 101), (3, 71, 101)]  # 70.7 → 71 by largest remainder
    assert q(mixture_db, f"select count(*) from (select agent_id from guesses group by agent_id having count(distinct {slow}) > 1)") == [(0,)]
    assert q(mixture_db, "select count(*), count(distinct (round, agent_id)) from guesses") == [(303, 303)]


def test_each_component_plays_on_its_own_actors(mixture_db):
    # 71 agents in shards of 20 → 4 shards, 30 agents → 2 shards: 6 shards a round, none mixed.
    assert q(mixture_db, "select count(*) from shards where round = 1") == [(6,)]
    assert q(mixture_db, """select count(*) from (select round, shard from guesses group by all
                            having count(distinct latency_s > 0) > 1)""") == [(0,)]
    workers = q(mixture_db, """select count(distinct s.worker) from shards s join guesses g using (run_id, round, shard)
                              group by g.latency_s > 0""")
    assert sorted(w for (w,) in workers) == [1, 1]  # 2 actors split 0.7/0.3 → 1 each
    assert q(mixture_db, """select count(*) from (select s.worker from shards s join guesses g using (run_id, round, shard)
                            group by s.worker having count(distinct g.latency_s > 0) > 1)""") == [(0,)]


def test_the_run_is_labelled_mixture_and_lists_its_components(mixture_db):
    (engine, model, spec), = q(mixture_db, "select engine, model, spec from runs")
    assert (engine, model) == ("mixture", "mixture")
    components = json.loads(spec)["components"]
    assert [(c["fraction"], c["engine"]["latency_s"]) for c in components] == [(0.7, 0.05), (0.3, 0.0)]
    assert q(mixture_db, "select distinct engine, model from guesses") == [("simulated", "simulated/uniform")]


def test_assignment_is_a_pure_function_of_seed_and_population():
    spec = load_config({**CONFIG, "name": "x"}).arms.engines[0]
    ids = np.arange(1000)
    a = spec.assign(ids, seed=1)
    assert (a == spec.assign(ids, seed=1)).all() and (a != spec.assign(ids, seed=2)).any()
    assert np.bincount(a).tolist() == [700, 300]
    assert spec.counts(101).tolist() == [71, 30] and spec.counts(3).tolist() == [2, 1]


def test_shards_never_mix_components():
    component = np.array([0, 1, 0, 0, 1, 0, 1])
    assert shard_index(component, 2).tolist() == [0, 2, 0, 1, 2, 1, 3]
    assert shard_index(np.zeros(5, np.int64), 2).tolist() == [0, 0, 1, 1, 2]


@pytest.mark.parametrize(
    "override, message",
    [
        ("arms.engines.0.components.0.fraction=0.5", "arms.engines.0.components: fractions sum to 0.8, expected 1"),
        ("arms.engines.0.components.1.engine.kind=warp", "arms.engines.0.components.1.engine.kind: unknown engine 'warp'; available:"),
        ("arms.engines.0.components.1.fraction=0", "arms.engines.0.components.1.fraction: 0: input should be greater than 0"),
    ],
)
def test_bad_mixtures_are_named(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(json.loads(json.dumps(CONFIG)), [override])
    assert str(err.value).startswith(message), str(err.value)


def test_a_mixture_that_cannot_fit_the_cluster_is_refused(local_ray):
    from tasks.pool import check_resources

    have = int(local_ray.cluster_resources()["CPU"])
    spec = MixtureSpec.model_validate({"components": [
        {"fraction": 0.5, "engine": {"kind": "simulated", "num_cpus": have}},
        {"fraction": 0.5, "engine": {"kind": "simulated", "num_cpus": have}},
    ]})
    with pytest.raises(ValueError, match=rf"the mixture's 2 actors need {2 * have} CPUs at once and the Ray cluster has {have}"):
        check_resources([c.engine for c in spec.components], spec.actors(2))
