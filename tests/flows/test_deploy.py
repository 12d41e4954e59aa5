"""`keynes serve` against a real Prefect server: a triggered run with an override, an
interval schedule that runs by itself, and nothing left running afterwards (checked when
the module's server is stopped, so the tests may run in any order).

The runs join the session's Ray (``workers.ray_address``), as a deployment on a cluster does,
except the one Ctrl-C stops (``interrupted``): it starts its own, which must be gone with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import duckdb
import httpx
import psutil
import pytest
import yaml

from tests.conftest import REPO
from tests.support.prefect_db import seed_home
from tests.support.processes import mark_of, marked, wait_marked
from tests.support.sql import q
from tests.support.waiting import free_port, wait_for

pytestmark = pytest.mark.slow

#: On a busy shared machine Ray's Python agents can take longer than the raylet's default
#: wait to register (the raylet then aborts): give them time.
SLOW_MACHINE = {"RAY_agent_register_timeout_ms": "120000"}

MANUAL = {
    "name": "manual",
    "seed": 3,
    "population": {"spec": "education.yaml", "size": 30},
    "game": {"rounds": 2},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 10},
    "report": {"enabled": False},  # pages are built by `reporting` (below), whose test reads its link
}
TICKER = {
    "name": "ticker",
    "seed": 5,
    "population": {"size": 12},
    "game": {"rounds": 1},
    "workers": {"actors": 1, "shard_size": 12},
    "schedule": {"interval_s": 5},
    "report": {"enabled": False},
    "continue": True,
}



def stop(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM the process group we started (the process, its flow runs, their Ray), then SIGKILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)




def traces(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (our Ray temp dir, our server home)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            pass
    return [p for p in found if p.pid != os.getpid()]


def joining(cfg: dict, ray_address: str) -> dict:
    """``cfg`` with its runs joining the Ray at ``ray_address`` instead of starting their own."""
    return {**cfg, "workers": {**cfg["workers"], "ray_address": ray_address}}


@pytest.fixture(scope="module")
def served(tmp_path_factory, local_ray):
    """A Prefect server on a free port and `keynes serve` of two configs against it."""
    folder = tmp_path_factory.mktemp("deploy")
    # Ray's socket paths must stay short: its temp dir goes under /tmp directly.
    ray_tmp = tempfile.mkdtemp(prefix="kray-")
    configs = {}
    ray_address = local_ray.get_runtime_context().gcs_address
    for cfg in (MANUAL, TICKER):
        data = {**joining(cfg, ray_address), "db": str(folder / f"{cfg['name']}.duckdb")}
        configs[cfg["name"]] = folder / f"{cfg['name']}.yaml"
        configs[cfg["name"]].write_text(yaml.safe_dump(data))
    # A migrated database, as on a machine where the server has run before.
    home = seed_home(folder / "prefect-home", tmp_path_factory)
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5", PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS="3",
               RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled", **SLOW_MACHINE)
    server_log = open(folder / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
    )
    serve = None
    try:
        wait_for(lambda: _healthy(api), 120, f"the Prefect server on port {port}")
        serve_env = {**env, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
        serve_env.pop("PREFECT_LOGGING_LEVEL")  # keynes serve logs flow runs at INFO, for the UI
        serve_log = open(folder / "serve.log", "w")
        report_port = free_port()
        serve = subprocess.Popen(
            [sys.executable, "-m", "cli.app", "serve", str(configs["manual"]), str(configs["ticker"]),
             "--report-port", str(report_port)],
            env=serve_env, stdout=serve_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO,
        )
        # Ticker's schedule runs only inside its own test: every 5 s it makes a flow run, and a
        # churning schedule beside the other tests' runs kept the server's SQLite locked for a
        # minute once (a client timed out and created an artifact twice).
        ticker = wait_for(lambda: _deployments(api).get("ticker"), 120, "the ticker deployment")
        _set_paused(api, ticker.id, True)
        yield {"api": api, "folder": folder, "configs": configs, "serve": serve, "ray_tmp": ray_tmp, "home": home,
               "reports": f"http://127.0.0.1:{report_port}", "ray_address": ray_address}
    finally:
        codes = []
        if serve is not None:
            stop(serve)
            codes.append(serve.returncode)
        stop(server)
        # Whatever ran (flow runs, the Ray each of them started) must be gone with serve and the
        # server. A leftover is killed, and then fails the module here, at teardown.
        leaked = []
        for marker in (ray_tmp, str(home)):
            deadline = time.monotonic() + 30
            while traces(marker) and time.monotonic() < deadline:
                time.sleep(1)
            for proc in traces(marker):
                leaked.append(" ".join(proc.cmdline()[:4]))
                proc.kill()
    # SIGTERM ends `keynes serve` cleanly: it exits by itself (0), not by the SIGKILL that follows a hang.
    assert all(code == 0 for code in codes), f"keynes serve exited with {codes} after SIGTERM"
    assert not leaked, f"processes outlived keynes serve and the Prefect server: {leaked}"


def _healthy(api: str) -> bool:
    try:
        return httpx.get(f"{api}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _client(api: str):
    """A Prefect client of ``api``; the session's own API setting is back when it ends, even
    when the client cannot connect (a server still starting)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        yield client


def _deployment_runs(api: str, name: str):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    with _client(api) as client:
        return client.read_flow_runs(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))


def _deployments(api: str) -> dict:
    with _client(api) as client:
        return {d.name: d for d in client.read_deployments()}


def _set_paused(api: str, deployment_id, paused: bool) -> None:
    """Pause a deployment's schedule (its scheduled runs are deleted) or resume it."""
    with _client(api) as client:
        (client.pause_deployment if paused else client.resume_deployment)(deployment_id)


def test_serve_registers_a_deployment_per_config_with_its_schedule(served):
    # The reporting fixture adds a third deployment to the same server when its tests ran first.
    deployments = wait_for(lambda: (d := _deployments(served["api"])) and {"manual", "ticker"} <= set(d) and d, 120,
                           "the manual and ticker deployments")
    manual, ticker = deployments["manual"], deployments["ticker"]
    assert manual.parameters == {"config": str(served["configs"]["manual"]), "overrides": [], "db": None, "models": None}
    assert manual.schedules == []
    assert [s.schedule.interval.total_seconds() for s in ticker.schedules] == [5.0]
    # The run form: a config path (or inline mapping), an overrides list, a db, a models profile.
    properties = manual.parameter_openapi_schema["properties"]
    assert {"config", "overrides", "db", "models"} <= set(properties)
    assert "dotted.key=value" in properties["overrides"]["description"]
    assert "laptop" in properties["models"]["description"]


def test_a_triggered_run_with_an_override_completes_and_writes_the_warehouse(served):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    wait_for(lambda: "manual" in _deployments(served["api"]), 120, "the manual deployment")
    with temporary_settings(updates={PREFECT_API_URL: served["api"]}):
        run = run_deployment(
            "experiment/manual", parameters={"overrides": ["population.size=24", "arms.prompts=[basic, cot]"]},
            timeout=240, poll_interval=2,
        )
    assert run.state is not None and run.state.is_completed(), (run.state, (served["folder"] / "serve.log").read_text()[-3000:])
    db = served["folder"] / "manual.duckdb"
    # 24 agents (the override, not the config's 30) × 2 rounds × 2 prompt modes
    assert q(db, "select population from experiments") == [(24,)]
    assert q(db, "select count(*), count(distinct run_id) from guesses") == [(24 * 2 * 2, 2)]
    assert q(db, "select count(*) from rounds") == [(4,)]
    assert run.name.startswith("manual-") and "24 agents × 2 arm(s) × 2 round(s)" in run.name


@contextmanager
def _scheduling(api: str, name: str):
    """A paused deployment's schedule, running while the block runs."""
    deployment = _deployments(api)[name]
    _set_paused(api, deployment.id, False)
    try:
        yield
    finally:
        _set_paused(api, deployment.id, True)


def test_the_interval_schedule_runs_by_itself(served):
    db = served["folder"] / "ticker.duckdb"

    def completed():
        runs = [r for r in _deployment_runs(served["api"], "ticker") if r.state and r.state.is_completed()]
        return len(runs) >= 2 and runs

    # Nobody triggers ticker: its runs come from the 5 s interval. The first plays the only
    # round (continue: true); the next ones find it played and end at once, saying so.
    with _scheduling(served["api"], "ticker"):
        runs = sorted(wait_for(completed, 300, "two scheduled runs of ticker to complete", interval_s=2), key=lambda r: r.start_time)
    assert all(r.auto_scheduled for r in runs)
    # A third run the schedule started before the pause may hold the file a moment: read once it is free.
    rounds, guesses = wait_for(lambda: _read(db, "select round, n from rounds", "select count(*) from guesses"), 60, "ticker's warehouse")
    assert rounds == [(1, 12)] and guesses == [(12,)]
    assert "is complete" in runs[-1].state.message and "nothing to play" in runs[-1].state.message


def _read(db, *queries: str) -> list | None:
    """Each query's rows, or None while a run holds the file's lock."""
    try:
        return [q(db, sql) for sql in queries]
    except duckdb.IOException:
        return None


def _run_artifacts(api: str, flow_run_id) -> list:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with _client(api) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))


@pytest.fixture(scope="module")
def reporting(served):
    """A second `keynes serve` against the same Prefect server, with its report server: one
    deployment (`reporting`) on its own runner, so ticker's schedule never holds its slot."""
    folder = served["folder"]
    config = folder / "reporting.yaml"
    config.write_text(yaml.safe_dump({**joining(MANUAL, served["ray_address"]), "name": "reporting", "db": str(folder / "reporting.duckdb"),
                                      "report": {"enabled": True}}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(served["home"]), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=served["api"],
               PREFECT_RUNNER_POLL_FREQUENCY="2", RAY_TMPDIR=served["ray_tmp"], RAY_AUTH_MODE="disabled", **SLOW_MACHINE)
    log = open(folder / "reporting.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "cli.app", "serve", str(config), "--report-port", str(port)],
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    try:
        wait_for(lambda: "reporting" in _deployments(served["api"]), 120, "the reporting deployment")
        yield {**served, "reports": f"http://127.0.0.1:{port}", "log": folder / "reporting.log"}
    finally:
        stop(process)


def test_a_runs_artifacts_link_its_live_report_page_and_nothing_is_duplicated(reporting):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.reports.browser import Chromium

    with temporary_settings(updates={PREFECT_API_URL: reporting["api"]}):
        run = run_deployment("experiment/reporting", parameters={"overrides": ["seed=4"]}, timeout=240, poll_interval=2)
    assert run.state.is_completed(), (run.state, reporting["log"].read_text()[-3000:])
    artifacts = _run_artifacts(reporting["api"], run.id)
    by_type: dict[str, list] = {}
    for artifact in artifacts:
        by_type.setdefault(artifact.type, []).append(artifact)
    experiment_id = run.name.split(":")[0]
    # One workers table (updated in place after each of the 2 rounds), one report link,
    # one progress bar per round of the arm, each at 100 %; no key appears twice.
    assert [a.key for a in by_type["table"]] == [f"workers-{experiment_id}"]
    assert len(by_type["progress"]) == 2
    assert all(a.data == 100.0 and "of 30 agents played" in a.description for a in by_type["progress"])
    keys = [a.key for a in artifacts if a.key]
    assert len(keys) == len(set(keys)), keys
    # Prefect keeps a link artifact as a markdown link: [text](url).
    links = [a for a in artifacts if a.key and a.key.endswith("-report")]
    assert len(links) == 1 and links[0].key == f"{experiment_id}-report"
    link = re.search(r"\]\((\S+)\)", links[0].data).group(1)
    assert link.startswith(reporting["reports"] + "/experiment?id="), link
    with Chromium(allow=("127.0.0.1",)) as browser:
        load = browser.open(link, canvases=3)
        text = browser.text()
    assert experiment_id in text and "Overview" in text
    assert not load.errors, load.errors


def test_a_bad_override_from_the_ui_fails_in_one_line_without_a_traceback(reporting):
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: reporting["api"]}):
        run = run_deployment("experiment/reporting", parameters={"overrides": ["population.size=-3"]}, timeout=240, poll_interval=2)
    expected = "population.size: -3: input should be greater than 0"
    assert run.state.is_failed() and run.state.message == expected, run.state
    assert run.name.startswith("reporting: invalid config or override, "), run.name
    # The logs reach the API a moment after the state.
    with _client(reporting["api"]) as client:
        logs = wait_for(lambda: (found := client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id]))))
                        and any(expected in log.message for log in found) and found, 30, "the run's logs")
    text = "\n".join(log.message for log in logs)
    assert "Traceback" not in text and "Encountered exception" not in text, text


def test_the_rounds_summary_links_the_runs_live_page_and_each_run_keeps_its_own_file(reporting):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: reporting["api"]}):
        run = run_deployment("experiment/reporting", parameters={"overrides": ["seed=5"]}, timeout=240, poll_interval=2)
    assert run.state.is_completed(), (run.state, reporting["log"].read_text()[-3000:])
    experiment_id = run.name.split(":")[0]
    rounds = next(a for a in _run_artifacts(reporting["api"], run.id) if a.key == f"{experiment_id}-rounds")
    # The link is the run's own page on the report server, over HTTP (a file:// link does
    # nothing when clicked in the UI), and the page answers.
    link = re.search(r"\]\((\S+)\)", rounds.data).group(1)
    assert link == f"{reporting['reports']}/experiment?id={experiment_id}" and "file://" not in rounds.data
    assert httpx.get(link, timeout=60).status_code == 200
    # The file the report stage wrote is this experiment's: another run's overrides do not overwrite it.
    assert (reporting["folder"] / f"reporting-report-{experiment_id}.html").exists()
    assert [t.name for t in _task_runs(reporting["api"], run.id) if t.name.startswith("report")] == [f"report-{experiment_id}"]


def _task_runs(api: str, flow_run_id) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with _client(api) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


#: Simulated agents that take 1 s per wave of 5: a run still plays when Ctrl-C comes.
SLOW = {
    "name": "slow",
    "seed": 2,
    "population": {"size": 40},
    "game": {"rounds": 30},
    "arms": {"engines": [{"kind": "simulated", "latency_s": 1.0, "concurrency": 5}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 20},
    "report": {"enabled": False},
}
#: One quick round and its report page, written with no report server to link.
FILED = {**TICKER, "name": "filed", "schedule": None, "continue": False, "report": {"enabled": True},
         "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]}}
#: Seconds a single Ctrl-C may take to stop `keynes serve` with a run in progress.
STOP_S = 5.0


@pytest.fixture(scope="module")
def interrupted(served):
    """`keynes serve` with no report server, run as in a terminal (its own process group, its
    output kept): a run of `filed` completes, one is refused (a bad override), and one of `slow`
    is playing when the group gets one SIGINT, what a terminal sends on Ctrl-C. What happened
    is kept for the tests below, whatever they find."""
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from cli.runtime.processes import TAG

    folder = served["folder"] / "interrupted"
    folder.mkdir()
    configs = []
    # Only the run that Ctrl-C stops needs a Ray of its own (that serve must take down with it).
    for cfg in (SLOW, joining(FILED, served["ray_address"])):
        configs.append(folder / f"{cfg['name']}.yaml")
        configs[-1].write_text(yaml.safe_dump({**cfg, "db": str(folder / f"{cfg['name']}.duckdb")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != TAG}
    env.update(PREFECT_HOME=str(served["home"]), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_API_URL=served["api"],
               PREFECT_RUNNER_POLL_FREQUENCY="2", RAY_TMPDIR=served["ray_tmp"], RAY_AUTH_MODE="disabled",
               KEYNES_CACHE=str(folder / "cache"), **SLOW_MACHINE)
    stdout, stderr = open(folder / "stdout.log", "w"), open(folder / "stderr.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "cli.app", "serve", *map(str, configs), "--report-port", "0"],
                               env=env, stdout=stdout, stderr=stderr, start_new_session=True, cwd=REPO)
    facts: dict = {"folder": folder, "api": served["api"], "stop_s": None}
    try:
        tag = mark_of(process.pid)
        wait_for(lambda: {"slow", "filed"} <= set(_deployments(served["api"])), 120, "the slow and filed deployments")
        wait_marked(tag)  # its watchdog carries the mark: the mark is serve's, and finding none left below can fail
        with temporary_settings(updates={PREFECT_API_URL: served["api"]}):
            facts["filed"] = run_deployment("experiment/filed", parameters={"overrides": ["seed=6"]}, timeout=240, poll_interval=2)
            facts["refused"] = run_deployment("experiment/filed", parameters={"overrides": ["game.rounds"]}, timeout=240,
                                              poll_interval=2)
            slow = run_deployment("experiment/slow", timeout=0)
        db = folder / "slow.duckdb"
        wait_for(lambda: _rounds_stored(db) >= 1, 240, "the slow run to play a round")
        started = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(60)
            facts["stop_s"] = time.monotonic() - started
        except subprocess.TimeoutExpired:
            pass
        facts["returncode"] = process.poll()
        # Every process the command started carries its mark (its watchdog too); zombies are not counted.
        facts["left"] = [" ".join(p.cmdline()[:3]) for p in marked(tag)]
        facts["records"] = sorted(p.name for p in (folder / "cache" / "runs").glob("*.json"))
        with _client(served["api"]) as client:
            facts["slow"] = client.read_flow_run(slow.id)
        facts["statuses"] = q(db, "select status from experiments union all select status from runs")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        stdout.close()
        stderr.close()
    facts["output"] = (folder / "stdout.log").read_text() + (folder / "stderr.log").read_text()
    return facts


def _rounds_stored(db) -> int:
    """Rounds stored so far (0 while the file is missing or a commit holds it)."""
    import duckdb

    try:
        return q(db, "select count(*) from rounds")[0][0] if db.exists() else 0
    except duckdb.IOException:
        return 0


def test_one_ctrl_c_stops_serve_within_seconds_and_marks_the_run_it_interrupted(interrupted):
    assert interrupted["stop_s"] is not None and interrupted["stop_s"] <= STOP_S, (interrupted["stop_s"], interrupted["output"][-3000:])
    assert interrupted["returncode"] == 0
    # Prefect's own verdict on a run stopped by Ctrl-C: Crashed, with the message keynes serve gives a run it ends itself.
    from flows.failures import INTERRUPT_MESSAGE

    state = interrupted["slow"].state
    assert state.is_crashed() and state.message == INTERRUPT_MESSAGE, state
    # The warehouse (and so the report index) says so too; nothing keynes started still runs,
    # and its watchdog's record is gone.
    assert interrupted["statuses"] == [("interrupted",), ("interrupted",)]
    assert interrupted["left"] == [] and interrupted["records"] == []
    assert "experiment slow-" in interrupted["output"] and "marked interrupted" in interrupted["output"]


def test_without_a_report_server_each_experiment_keeps_its_own_page_and_no_link_is_dead(interrupted):
    run = interrupted["filed"]
    assert run.state.is_completed(), run.state
    experiment_id = run.name.split(":")[0]
    page = interrupted["folder"] / f"filed-report-{experiment_id}.html"
    assert page.exists() and not (interrupted["folder"] / "filed-report.html").exists()
    artifacts = {a.key: a.data for a in _run_artifacts(interrupted["api"], run.id)}
    for key in (f"{experiment_id}-rounds", f"{experiment_id}-report"):
        assert str(page) in artifacts[key] and "file://" not in artifacts[key], artifacts[key][:500]


def test_serve_prints_no_traceback_and_no_task_chatter_and_a_refused_override_names_the_parameter(interrupted):
    refused = interrupted["refused"]
    expected = "overrides 'game.rounds': expected dotted.key=value"
    assert refused.state.is_failed() and refused.state.message == expected, refused.state
    output = interrupted["output"]
    assert expected in output, output[-5000:]
    for noise in ("Traceback", "| INFO    | Task run", "Process exited with status code", "was never awaited",
                  "ProcessLookupError", "--set"):
        assert noise not in output, (noise, output[-5000:])
