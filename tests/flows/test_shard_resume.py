"""A round interrupted with some shards committed, resumed after ``workers.actors`` changed: keynes
keeps the shard size the experiment started with (recorded with its config), so the round's
shards keep their boundaries and every ``shards`` row lands (none is lost to a clash of shard
numbers), and the guesses equal an uninterrupted run's."""

from __future__ import annotations

import shutil

import duckdb

from design.loading import load_config
from design.shards import shard_size
from flows.experiment import experiment
from tests.support.sql import q

N = 60
CONFIG = {
    "name": "resharded",
    "seed": 3,
    "population": {"spec": "education.yaml", "size": N},
    "game": {"ratio": "2/3", "rounds": 2},
    # One request at a time (batch 1): keynes's size is then 8 on 2 actors, 15 on 1.
    "arms": {"engines": [{"kind": "simulated", "rule": "uniform", "concurrency": 1}], "prompts": ["basic"]},
    "workers": {"actors": 2},
    "report": {"enabled": False},
}
GUESSES = "select g.round, g.agent_id, g.guess, g.shard from guesses g order by 1, 2"


def interrupt_round_2(path, shards: tuple[int, ...]) -> None:
    """What a run killed in round 2 leaves: those shards' rows gone, the round not stored."""
    with duckdb.connect(str(path)) as con:
        for table in ("guesses", "shards"):
            con.execute(f"delete from {table} where round = 2 and list_contains(?, shard)", [list(shards)])
        for table in ("rounds", "winners"):
            con.execute(f"delete from {table} where round = 2")


def test_a_resumed_round_keeps_its_shards_when_the_actors_change(tmp_path, prefect_api, local_ray):
    first = load_config(CONFIG)
    assert shard_size(first) == 8 and shard_size(load_config(CONFIG, ["workers.actors=1"])) == 15
    whole = tmp_path / "whole.duckdb"
    experiment(CONFIG, db=str(whole))
    assert q(whole, "select json_extract(config, '$.workers.shard_size')::int from experiments") == [(8,)]

    resumed = tmp_path / "resumed.duckdb"
    shutil.copy(whole, resumed)
    interrupt_round_2(resumed, (1, 3, 7))
    summary = experiment(CONFIG, overrides=["workers.actors=1"], db=str(resumed))

    assert summary.rows_written == 8 + 8 + 4  # shards 1, 3 and 7 (the last: 60 - 56)
    # Eight shards of 8 (the last of 4), each with its row: none lost to a clash with a stored
    # shard of another size.
    assert q(resumed, "select count(*), sum(n) from shards where round = 2") == [(8, N)]
    assert q(resumed, "select count(*) from guesses where shard != agent_id // 8") == [(0,)]
    assert q(resumed, GUESSES) == q(whole, GUESSES)
    outcome = "select round, mean, target, winning_guess from rounds order by 1"
    assert q(resumed, outcome) == q(whole, outcome)
