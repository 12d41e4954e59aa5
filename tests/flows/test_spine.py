"""The spine end to end: config → personas → Ray shards → environment → DuckDB."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flows.experiment import experiment
from tests.conftest import REPO
from tests.support.sql import q

#: The quick tier's one simulated flow end to end.
pytestmark = pytest.mark.quick

CONFIG = {
    "name": "spine",
    "seed": 7,
    "population": {"spec": "education.yaml", "size": 250},
    "game": {"ratio": "2/3", "rounds": 3},
    "arms": {"engines": [{"kind": "simulated", "rule": "uniform"}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 2, "shard_size": 40},
}


@pytest.fixture(scope="module")
def spine_db(tmp_path_factory, prefect_api, local_ray):
    from unittest import mock

    from design import loading

    path = tmp_path_factory.mktemp("spine") / "spine.duckdb"
    with mock.patch.object(loading, "_parse", wraps=loading._parse) as parse:
        summary = experiment(CONFIG, db=str(path))
    return path, summary, parse.call_count


def test_the_config_is_parsed_once_per_run(spine_db):
    """The flow run's name and the flow itself read the same config: validated once."""
    assert spine_db[2] == 1


def test_every_agent_guesses_every_round_of_every_arm(spine_db):
    path, summary, _ = spine_db
    assert summary.rows_written == 250 * 3 * 2
    assert q(path, "select count(*) from guesses") == [(250 * 3 * 2,)]
    assert q(path, "select count(*) from (select distinct run_id, round, agent_id from guesses)") == [(1500,)]
    assert q(path, "select count(*), count(distinct arm) from runs") == [(2, 2)]
    assert q(path, "select count(*) from personas") == [(250,)]


def test_shards_ran_on_several_actors(spine_db):
    path, *_ = spine_db
    # 250 agents in shards of 40 → 7 shards per round and arm
    assert q(path, "select count(*) from shards") == [(7 * 3 * 2,)]
    assert q(path, "select count(distinct worker) from shards")[0][0] >= 2


def test_targets_match_an_independent_sql_computation(spine_db):
    path, *_ = spine_db
    rows = q(
        path,
        """select r.run_id, r.round, r.target, r.mean, g.mean, least(greatest(2/3 * g.mean + 0, 0), 100)
           from rounds r join (select run_id, round, avg(guess) as mean from guesses where valid
                               group by all) g using (run_id, round)""",
    )
    assert len(rows) == 6
    for _, _, target, mean, sql_mean, sql_target in rows:
        assert mean == pytest.approx(sql_mean, abs=1e-9)
        assert target == pytest.approx(sql_target, abs=1e-9)


def test_winners_are_exactly_the_nearest_agents(spine_db):
    path, *_ = spine_db
    mismatches = q(
        path,
        """with d as (select g.run_id, g.round, g.agent_id, abs(g.guess - r.target) as dist
                      from guesses g join rounds r using (run_id, round) where g.valid),
                best as (select run_id, round, min(dist) as m from d group by all),
                expected as (select d.run_id, d.round, d.agent_id from d join best using (run_id, round)
                             where d.dist <= best.m + 1e-9)
           select count(*) from (
               (select * from expected except select * from winners)
               union all
               (select * from winners except select * from expected))""",
    )
    assert mismatches == [(0,)]
    assert q(path, "select sum(n_winners) = (select count(*) from winners) from rounds") == [(True,)]


def test_every_stored_guess_is_in_bounds_or_flagged(spine_db):
    path, *_ = spine_db
    assert q(path, "select count(*) from guesses where valid and (guess < 0 or guess > 100 or guess != round(guess))") == [(0,)]
    assert q(path, "select count(*) from guesses where not valid and error is null") == [(0,)]
    assert q(path, "select distinct engine, model from guesses") == [("simulated", "simulated/uniform")]


def test_chain_of_thought_rows_keep_their_reasoning(spine_db):
    path, *_ = spine_db
    rows = q(path, "select r.prompt_mode, count(g.reasoning) from guesses g join runs r using (run_id) group by all order by 1")
    assert rows == [("basic", 0), ("cot", 750)]


def test_arms_are_paired_same_seed_same_draws(spine_db):
    # The simulated uniform rule ignores the prompt: paired arms get identical draws.
    path, *_ = spine_db
    assert q(
        path,
        """select count(*) from guesses a join guesses b using (round, agent_id)
           join runs ra on a.run_id = ra.run_id join runs rb on b.run_id = rb.run_id
           where ra.arm = 0 and rb.arm = 1 and a.guess != b.guess""",
    ) == [(0,)]


def test_running_again_writes_nothing_new(spine_db, prefect_api, local_ray):
    path, *_ = spine_db
    before = q(path, "select (select count(*) from guesses), (select count(*) from rounds), (select count(*) from winners), (select count(*) from personas)")
    summary = experiment(CONFIG, db=str(path))
    assert summary.rows_written == 0 and summary.rounds_played == 0
    after = q(path, "select (select count(*) from guesses), (select count(*) from rounds), (select count(*) from winners), (select count(*) from personas)")
    assert after == before


def test_second_round_prompt_announces_the_previous_winner(spine_db):
    """Round 2's prompts as ``play_round`` sent them name round 1's winning number and the agent's
    own guess. What was sent is read back from what the simulated engine stored: a chain of
    thought's reasoning is its free text for (prompt, seed), a digest of both (engines/simulated.py).
    The prompts expected here (the stored personas, the stored round-1 outcome and each agent's
    stored guess) must give, on the same engine with the same seeds, the reasoning the flow
    stored: they are the prompts it sent."""
    from core.game import GameRule
    from core.seeds import sampling_seeds
    from engines import RequestBatch, Sampling, build_engine, parse_spec
    from prompts.context import agent_variables, round_variables
    from prompts.render import format_number, render
    from warehouse.store import Warehouse

    path, *_ = spine_db
    rule = GameRule(ratio="2/3", rounds=3)
    [(run_id, experiment_id)] = q(path, "select run_id, experiment_id from runs where prompt_mode = 'cot'")
    warehouse = Warehouse(path)
    history = warehouse.history(run_id, 2)
    personas = warehouse.read_personas(experiment_id).sort("agent_id")  # as the flow reads them back
    agents = personas.join(warehouse.own_guesses(run_id, 2), on="agent_id", how="left")
    [(winner,)] = q(path, "select winning_guess from rounds where run_id = ? and round = 1", [run_id])
    guesses = q(path, "select agent_id, guess from guesses where run_id = ? and round = 1 order by agent_id", [run_id])
    assert [h["round"] for h in history] == [1] and agents["agent_id"].to_list() == [a for a, _ in guesses]
    texts = render("cot.j2", round_variables(rule, personas, 2, history), agent_variables(agents))
    assert len(texts) == 250
    for text, (_, guess) in zip(texts, guesses):
        assert f"the winning number was {format_number(winner)}" in text, text
        assert f"you named {format_number(guess)}." in text, text
    # The stored reasoning of round 2 is the engine's free text for exactly these prompts ...
    ids = agents["agent_id"].to_numpy()
    seeds = sampling_seeds(CONFIG["seed"], ids, 2)
    engine = build_engine(parse_spec(CONFIG["arms"]["engines"][0]))
    expected = engine.generate(RequestBatch(ids, texts, seeds, Sampling(0.7, 16), None)).text
    stored = [r for (r,) in q(path, "select reasoning from guesses where run_id = ? and round = 2 order by agent_id", [run_id])]
    assert stored == list(expected), [(s, e) for s, e in zip(stored, expected) if s != e][:3]
    # ... and not for the same agents' prompts without round 1's outcome (what round 1 showed them).
    unaware = render("cot.j2", round_variables(rule, personas, 2, []), agent_variables(personas))
    assert not set(engine.generate(RequestBatch(ids, unaware, seeds, Sampling(0.7, 16), None)).text) & set(stored)


@pytest.mark.parametrize(
    "override, message",
    [
        ('game.ratio="2/0"', "game.ratio: '2/0' is not a fraction"),
        ("population.size=-5", "population.size: -5"),
        ("arms.engines.0.kind=warp", "unknown engine 'warp'; available:"),
        ("game.ratoi=1", "game.ratoi: unknown key (did you mean 'ratio'?)"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_field(override, message, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cli.app", "run", str(REPO / "experiments/quickstart.yaml"), "--db", str(tmp_path / "x.duckdb"), "--set", override],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "x.duckdb").exists()
