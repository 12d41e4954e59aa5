"""``game.history`` through the real flow: the setting is stored with the experiment, queryable,
and changes what agents are told — on the simulated engine (which counts a prompt's words as its
tokens) and on the shared-context path of llama.cpp (agents of one persona share a prompt)."""

from __future__ import annotations

import pytest

from flows.experiment import experiment
from tasks.pool import shutdown_pools
from tests.support.sql import q

N = 20


def config(history: dict | None) -> dict:
    game = {"ratio": "2/3", "rounds": 3} | ({"history": history} if history is not None else {})
    return {"name": "history", "seed": 3, "population": {"spec": "education.yaml", "size": N}, "game": game,
            "arms": {"engines": [{"kind": "simulated", "rule": "uniform"}], "prompts": ["basic"]},
            "workers": {"actors": 1, "shard_size": N}, "report": {"enabled": False}}


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, prefect_api, local_ray):
    """One file, two experiments: the default history and the last round without own guesses."""
    path = tmp_path_factory.mktemp("history") / "history.duckdb"
    for history in (None, {"rounds": 1, "own_guesses": False}):
        assert experiment(config(history), db=str(path)).rows_written == N * 3
    return path


def growth(path, history_rounds: str) -> set[tuple[int, int]]:
    """Each agent's prompt words added from round 1 to 2 and from round 2 to 3, in the experiment
    whose stored game.history.rounds is ``history_rounds`` (one row per distinct pair)."""
    return set(q(path, """
        select (g2.prompt_tokens - g1.prompt_tokens)::INT, (g3.prompt_tokens - g2.prompt_tokens)::INT
        from experiments e join runs r using (experiment_id)
        join guesses g1 on g1.run_id = r.run_id and g1.round = 1
        join guesses g2 on g2.run_id = r.run_id and g2.round = 2 and g2.agent_id = g1.agent_id
        join guesses g3 on g3.run_id = r.run_id and g3.round = 3 and g3.agent_id = g1.agent_id
        where json_extract_string(e.config, '$.game.history.rounds') = ?""", [history_rounds]))


def test_the_setting_is_stored_with_the_experiment_and_queryable(warehouse):
    rows = q(warehouse, """select json_extract_string(config, '$.game.history.rounds'), json_extract(config, '$.game.history.own_guesses')::BOOLEAN
                           from experiments order by created_at""")
    assert rows == [("all", True), ("1", False)]
    assert q(warehouse, "select count(distinct experiment_id), count(distinct config_hash) from experiments") == [(2, 2)]


def test_the_setting_changes_what_agents_are_told(warehouse):
    # Round 2 adds "This is round 2 of 3." (6 words) and "In round 1, the average was A and the winning
    # number was W." (13 words); by default also "you named X." (3 words; "W." becomes "W;").
    # Round 3 then adds round 2's line by default (13 + 3 words), nothing when only the last round is told.
    assert growth(warehouse, "all") == {(22, 16)}
    assert growth(warehouse, "1") == {(19, 0)}


@pytest.mark.llm
def test_without_own_guesses_agents_of_one_persona_share_a_context_on_llamacpp(tmp_path, prefect_api, local_ray):
    """The shared-context path evaluates each distinct prompt once: without own guesses round 2 has
    one prompt per education level, as round 1 (with them, one per (level, first guess):
    tests/flows/test_shared_context.py)."""
    data = config({"rounds": "all", "own_guesses": False}) | {"population": {"spec": "education.yaml", "size": 10}}
    # SmolLM2 and numbers from 0 to 10: each prompt's answer tree is 11 answers (as test_shared_context.py).
    data["game"] |= {"rounds": 2, "high": 10}
    data["arms"]["engines"] = [{"kind": "llamacpp", "model": "smollm2-135m-instruct", "num_cpus": 0.5}]
    path = tmp_path / "shared.duckdb"
    try:
        assert experiment(data, db=str(path)).rows_written == 20
    finally:
        shutdown_pools()
    assert q(path, "select round, count(distinct context), count(*) filter (where shared_prompt) from guesses group by round order by round") == [
        (1, 5, 10), (2, 5, 10)]
    # every agent of one education level shares its level's context
    assert q(path, """select count(*) from (select g.round, p.education from guesses g join personas p using (agent_id)
                                            group by all having count(distinct g.context) > 1)""") == [(0,)]


def test_the_report_shows_each_experiments_setting(warehouse, tmp_path):
    from reports.data import ReportData
    from reports.export import write_reports
    from warehouse.store import Warehouse

    default, last = [e for (e,) in q(warehouse, "select experiment_id from experiments order by created_at")]
    told = ReportData(Warehouse(warehouse), [default, last]).history
    assert told == {default: "every earlier round, with own guesses", last: "the last 1 round, without own guesses"}
    [page] = write_reports(warehouse, tmp_path / "compare.html", [default, last])
    html = page.read_text(encoding="utf-8")
    assert "told of earlier rounds" in html and "the last 1 round, without own guesses" in html
    assert "every earlier round, with own guesses" in html
