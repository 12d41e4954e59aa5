"""Analyses land with their round: after a run with the report disabled, every stored round has
its τ fits and the paired tests of the arms that differ in one factor, computed by the flow."""

from __future__ import annotations

import pytest

from flows.experiment import experiment
from tests.support.sql import q

CONFIG = {
    "name": "analyses",
    "seed": 5,
    "population": {"spec": "education.yaml", "size": 60},
    "game": {"rounds": 2},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 1, "shard_size": 30},
    "report": {"enabled": False},
}


@pytest.fixture(scope="module")
def played(tmp_path_factory, prefect_api, local_ray):
    path = tmp_path_factory.mktemp("analyses") / "analyses.duckdb"
    return path, experiment(CONFIG, db=str(path))


def test_every_stored_round_has_its_tau_fits_without_a_report(played):
    path, summary = played
    stored = q(path, "select run_id, round from rounds order by all")
    assert len(stored) == 4
    fitted = q(path, "select distinct run_id, round from cognitive_hierarchy_fit where status = 'computed' order by all")
    assert fitted == stored
    assert q(path, "select count(*) from cognitive_hierarchy_fit where status <> 'computed'") == [(0,)]
    # per persona attribute value too (education), not only the whole arm
    assert q(path, "select count(distinct value) from cognitive_hierarchy_fit where attribute = 'education'")[0][0] >= 2
    assert summary.analyses_s > 0
    assert not list((path.parent).glob("*.html")), "the report was disabled"


def test_the_two_prompt_modes_are_compared_agent_by_agent_in_every_round(played):
    path, _ = played
    rows = q(path, "select round, factor, level_a, level_b, n_pairs, status from paired_comparisons order by round")
    assert rows == [(1, "prompt mode", "basic", "cot", 60, "computed"), (2, "prompt mode", "basic", "cot", 60, "computed")]
