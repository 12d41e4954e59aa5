"""`continue: true`: each flow run plays the next round of every arm, until game.rounds."""

from __future__ import annotations

import pytest

from design.loading import load_config
from flows.experiment import experiment
from tasks.personas import PersonasStored
from tests.support.sql import q

CONFIG = {
    "name": "serial",
    "seed": 11,
    "population": {"spec": "education.yaml", "size": 40},
    "game": {"ratio": "2/3", "rounds": 3},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 2, "shard_size": 15},
    "report": {"enabled": False},
    "continue": True,
}



def played(path):
    return q(path, "select r.arm, o.round from rounds o join runs r using (run_id) order by 1, 2")


def flow_run_name(state) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id).name


def test_schedule_and_continue_do_not_change_the_experiment():
    base = {k: v for k, v in CONFIG.items() if k != "continue"}
    plain = load_config(base)
    assert load_config(CONFIG).experiment_id == plain.experiment_id
    assert load_config(base, ["schedule.interval_s=5"]).experiment_id == plain.experiment_id
    assert load_config(base, ["schedule.cron=0 * * * *"]).config_hash == plain.config_hash
    # `continue` is written back under its own name, so a stored config loads again
    assert load_config(load_config(CONFIG).model_dump(mode="json")).continue_ is True


@pytest.fixture(scope="module")
def serial_runs(tmp_path_factory, prefect_api, local_ray):
    """Four runs of a 3-round continue experiment, and the same experiment played at once."""
    folder = tmp_path_factory.mktemp("continue")
    path = folder / "serial.duckdb"
    runs = []
    for _ in range(4):
        state = experiment(CONFIG, db=str(path), return_state=True)
        runs.append((state, state.result(), played(path), q(path, "select status from runs order by arm")))
    whole = folder / "whole.duckdb"
    experiment(CONFIG, overrides=["continue=false"], db=str(whole))
    return path, whole, runs


def test_each_run_advances_exactly_one_round_per_arm(serial_runs):
    _, _, runs = serial_runs
    for k, (state, summary, rounds, _) in enumerate(runs[:3], start=1):
        assert state.is_completed()
        assert summary.rounds_played == 2 and summary.rows_written == 2 * 40
        assert rounds == [(arm, r) for arm in (0, 1) for r in range(1, k + 1)]
        assert summary.complete is (k == 3)
    assert [statuses for *_, statuses in runs[:3]] == [[("waiting",)] * 2, [("waiting",)] * 2, [("completed",)] * 2]


def test_after_the_last_round_runs_end_at_once_with_a_clear_message(serial_runs):
    path, _, runs = serial_runs
    state, summary, rounds, statuses = runs[3]
    assert state.is_completed()
    assert summary.rounds_played == 0 and summary.complete is True
    assert "is complete: all 3 round(s) of 2 arm(s)" in state.message and "nothing to play" in state.message
    assert rounds == runs[2][2] and statuses == [("completed",)] * 2
    assert q(path, "select count(*) from guesses") == [(3 * 2 * 40,)]


def test_flow_run_names_say_which_round_is_next(serial_runs):
    _, _, runs = serial_runs
    names = [flow_run_name(state) for state, *_ in runs]
    experiment_id = runs[0][1].experiment_id
    assert names[0] == f"{experiment_id}: 40 agents × 2 arm(s), round 1 of 3"
    assert names[2].endswith("round 3 of 3")
    assert names[3].endswith("all 3 round(s) done")


def test_rounds_played_one_per_run_equal_rounds_played_at_once(serial_runs):
    # The history each round shows (read back from the warehouse) makes later prompts
    # longer; run by run or all at once, every agent sees the same prompt and guesses alike.
    path, whole, _ = serial_runs
    sql = "select r.arm, g.round, g.agent_id, g.guess, g.prompt_tokens from guesses g join runs r using (run_id) order by 1, 2, 3"
    serial, at_once = q(path, sql), q(whole, sql)
    assert len(serial) == 3 * 2 * 40 and serial == at_once
    tokens = dict(q(path, "select round, avg(prompt_tokens) from guesses group by round"))
    assert tokens[1] < tokens[2] < tokens[3]
    outcome = "select run_id, round, mean, target, winning_guess, n_winners from rounds order by 1, 2"
    assert q(path, outcome) == q(whole, outcome)


def test_each_run_shows_progress_round_outcomes_and_workers_in_the_ui(serial_runs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    path, _, runs = serial_runs
    state, summary, *_ = runs[1]  # the run that played round 2
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    by_type: dict[str, list] = {}
    for artifact in artifacts:
        by_type.setdefault(artifact.type, []).append(artifact)
    run_ids = [f"{summary.experiment_id}-arm{i}" for i in (0, 1)]
    # one progress bar per arm of this round, finished
    progress = {a.key: a for a in by_type["progress"]}
    assert set(progress) == {f"progress-{r}-round-2" for r in run_ids}
    assert all(a.data == 100.0 and "40 of 40 agents played (100 %)" in a.description for a in progress.values())
    # one markdown outcome per arm of this round, with the stored figures
    markdown = {a.key: a.data for a in by_type["markdown"]}
    assert set(markdown) == {f"{r}-round-2" for r in run_ids}
    mean, target, n_winners = q(path, f"select mean, target, n_winners from rounds where run_id = '{run_ids[0]}' and round = 2")[0]
    text = markdown[f"{run_ids[0]}-round-2"]
    assert f"| mean | {mean:.4g} |" in text and f"| target (2/3 × mean) | {target:.4g} |" in text
    assert f"| winners | {n_winners:,}: agents" in text and "invalid rate 0.0%" in text
    # the Ray workers of this run: shards of round 2 only (both arms), by node and worker
    tables = [a for a in by_type["table"] if a.key == f"workers-{summary.experiment_id}"]
    assert tables
    import json

    latest = max(tables, key=lambda a: a.created).data  # a new version after each round
    rows = json.loads(latest) if isinstance(latest, str) else latest
    assert sum(r["shards"] for r in rows) == 2 * 3 and sum(r["agents"] for r in rows) == 2 * 40


def test_later_runs_take_the_personas_from_prefects_cache(serial_runs):
    """A later run does not sample again: Prefect answers the personas stage from its cache
    (keyed by experiment id, size and warehouse file); the cached record is a receipt,
    the personas themselves are read from the warehouse."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    path, _, runs = serial_runs
    states = []
    with get_client(sync_client=True) as client:
        for state, *_ in runs[:3]:
            task_runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
            )
            states += [r.state for r in task_runs if r.name.startswith("personas-")]
    assert [s.name for s in states] == ["Completed", "Cached", "Cached"]
    experiment_id = runs[0][1].experiment_id
    assert states[1].result() == PersonasStored(experiment_id, agents=40, sampled=True)
    assert q(path, "select count(*), count(distinct agent_id) from personas") == [(40, 40)]
