"""A run killed after its last round was stored but before that round's analyses: the rerun,
which has no round left to play, stores them (else the warehouse would stay without them)."""

from __future__ import annotations

from flows.experiment import experiment
from tests.support.sql import q

CONFIG = {
    "name": "last-analyses",
    "seed": 8,
    "population": {"spec": "education.yaml", "size": 40},
    "game": {"rounds": 2},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 1, "shard_size": 40},
    "report": {"enabled": False},
}
ANALYSES = {
    "tau_fits": "select * exclude (computed_at) from tau_fits order by all",
    "paired_tests": "select * exclude (computed_at) from paired_tests order by all",
}


def test_a_rerun_with_nothing_to_play_stores_the_last_rounds_missing_analyses(tmp_path, prefect_api, local_ray):
    import duckdb

    path = tmp_path / "last.duckdb"
    experiment(CONFIG, db=str(path))
    stored = {table: q(path, sql) for table, sql in ANALYSES.items()}
    assert {r[1] for r in stored["tau_fits"]} == {1, 2} and len(stored["paired_tests"]) == 2
    # What a kill between the last round's commit and its analyses leaves behind.
    with duckdb.connect(str(path)) as con:
        con.execute("delete from tau_fits where round = 2")
        con.execute("delete from paired_tests where round = 2")

    summary = experiment(CONFIG, db=str(path))

    assert summary.complete and summary.rounds_played == 0
    assert {table: q(path, sql) for table, sql in ANALYSES.items()} == stored
