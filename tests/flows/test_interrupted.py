"""An interrupted run is marked where users look: its experiment and its unfinished arms get the
status `interrupted` in the warehouse (arms already finished keep theirs)."""

from __future__ import annotations

import os
import signal
import time

import duckdb
import pytest
from prefect.exceptions import TerminationSignal

from design.loading import load_config
from flows.failures import _as_parameter, mark_interrupted, one_line_failures
from tasks import store
from tests.support.sql import q

TWO_ARMS = {
    "name": "stopped",
    "seed": 1,
    "population": {"size": 4},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", "cot"]},
    "report": {"enabled": False},
}


@pytest.mark.quick
def test_the_experiment_and_its_unfinished_arms_are_marked_interrupted(db):
    cfg = load_config(TWO_ARMS, [f"db={db}"])
    warehouse = store.open_warehouse(db)
    store.begin_experiment(warehouse, cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, 4)
    first, second = cfg.arms_list()
    store.begin_runs(warehouse, [store.run_row(cfg.experiment_id, arm) for arm in (first, second)])
    store.finish_run(warehouse, first.run_id, "completed")

    assert mark_interrupted(TWO_ARMS, db=str(db)) == cfg.experiment_id
    assert q(db, "select status from experiments") == [("interrupted",)]
    assert q(db, "select run_id, status from runs order by arm") == [(first.run_id, "completed"), (second.run_id, "interrupted")]
    # A run that is not running (completed, waiting for its next round) is left alone.
    store.finish_experiment(warehouse, cfg.experiment_id, "waiting")
    mark_interrupted(TWO_ARMS, db=str(db))
    assert q(db, "select status from experiments") == [("waiting",)]


@pytest.mark.quick
def test_nothing_is_marked_or_created_without_a_warehouse_or_a_valid_config(tmp_path):
    assert mark_interrupted(TWO_ARMS, db=str(tmp_path / "none.duckdb")) is None
    assert not (tmp_path / "none.duckdb").exists()
    assert mark_interrupted(TWO_ARMS, ["population.size=-1"], db=str(tmp_path / "none.duckdb")) is None


@pytest.mark.quick
def test_an_override_error_in_a_flow_run_names_its_overrides_parameter():
    assert _as_parameter("--set 'game.rounds': expected dotted.key=value") == "overrides 'game.rounds': expected dotted.key=value"
    assert _as_parameter("population.size: -3: input should be greater than 0") == "population.size: -3: input should be greater than 0"


@pytest.mark.quick
def test_a_sigterm_that_a_duckdb_query_turns_into_its_own_error_still_ends_the_run_as_interrupted(db):
    """DuckDB handles a signal that arrives during a query by raising its own error, "Query
    interrupted", the handler's TerminationSignal gone from the chain (seen with a long query:
    when DuckDB notices the signal depends on the query's plan, so the test raises that error
    itself, as DuckDB does, once the signal's handler has run). Taken for a crash, it would end the
    run with a traceback (exit 1) and leave the experiment `running`."""
    cfg = load_config(TWO_ARMS, [f"db={db}"])
    store.begin_experiment(store.open_warehouse(db), cfg.experiment_id, cfg.name, cfg.model_dump(mode="json"), cfg.config_hash, cfg.seed, 4)

    @one_line_failures
    def flow(config: dict, overrides: list | None = None, db: str | None = None) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        except TerminationSignal:
            raise duckdb.InterruptException("INTERRUPT Error: Query interrupted") from None

    def prefects(signum, frame):  # what a flow run's SIGTERM handler does
        raise TerminationSignal(signal=signum)

    previous = signal.signal(signal.SIGTERM, prefects)
    try:
        with pytest.raises(TerminationSignal) as raised:
            flow(TWO_ARMS, db=str(db))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert "interrupted" in str(raised.value.__cause__).lower()  # DuckDB's own error, kept as the cause
    assert q(db, "select status from experiments") == [("interrupted",)]
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.quick
def test_no_task_retries_an_error_once_the_run_is_interrupted(db):
    """A Ctrl-C reaches the run's actors too (one process group): their error in play is a Ray
    error, which tasks retry as transient; a retry would play the round again and the run would
    complete with exit 0, the Ctrl-C lost. Inside the flow, a noted signal stops retries; the next
    run retries again."""
    from prefect.states import Failed

    from tasks.retries import INTERRUPTED, retry_transient

    failed = Failed(data=OSError("the engine went away"))
    seen: list[bool] = []

    @one_line_failures
    def flow(config: dict, overrides: list | None = None, db: str | None = None) -> None:
        seen.append(retry_transient(None, None, failed))
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Python's own handler: KeyboardInterrupt, noted first
            time.sleep(1)
        except KeyboardInterrupt:  # where a task meets the interrupt's error and Prefect asks whether to retry
            seen.append(retry_transient(None, None, failed))
            raise

    ignored = signal.signal(signal.SIGINT, signal.default_int_handler)  # a pytest-xdist worker ignores Ctrl-C
    try:
        with pytest.raises(KeyboardInterrupt):
            flow(TWO_ARMS, db=str(db))
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert seen == [True, False]
    assert not INTERRUPTED.is_set() and retry_transient(None, None, failed)  # the next run retries again
