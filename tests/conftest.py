"""Shared fixtures: one Prefect test API and one local Ray for the whole session."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from cli.runtime import settings

# Prefect reads its settings at import: point it at a throwaway home first (removed at exit;
# pytest's workers inherit the first process's).
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="keynes-prefect-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)
# keynes's own process settings (cli/runtime/settings.py), as the CLI sets them.
settings.apply({"RAY_AUTH_MODE": "disabled"})
# On a busy shared machine Ray's Python agents can take longer than the raylet's default
# wait to register (the raylet then aborts); set before any test starts a Ray.
os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
# No idle worker processes started ahead of the first task: each Ray of the session (and of
# every `keynes run` a test starts) would keep two, at ~1.5 CPU-s a minute, on a machine whose
# two cores the suite keeps busy. An actor then waits ~1 s for its process to start.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# One thread per process: the suite's two workers already keep both cores busy, and torch's
# OpenMP threads (vLLM on CPU) spin at every barrier while the other worker holds the core they
# wait for: a vLLM batch measured 24.1 s on two threads against 14.5 s on one, beside a busy core;
# experiments/vllm_cpu.yaml's round 190 s against 87 s. Ray leaves a set OMP_NUM_THREADS alone, so
# actors with num_cpus 2 run one thread too.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The session's vLLM server asks for an API key (tests/support/vllm.py): its variable is set before
# any Ray starts, so the actors of a flow that talks to the server read it as the client does.
from tests.support.vllm import VLLM_KEY_ENV  # noqa: E402

os.environ.setdefault(VLLM_KEY_ENV, "keynes-test-key")

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from flows.experiment import ExperimentSummary

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """Prefect's real API (a temporary local server, Prefect's own test harness) for the whole
    session, on a copy of the session's migrated database (tests/support/prefect_db.py)."""
    from unittest import mock

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from tests.support.prefect_db import seed_home

    folder = seed_home(tmp_path_factory.mktemp("prefect-api"), tmp_path_factory, name="prefect-test.db")  # the harness's file
    # A loaded machine can take minutes to start it: the usual setting changes the wait (default 180 s).
    with mock.patch("prefect.testing.utilities.mkdtemp", lambda: str(folder)), \
            prefect_test_harness(server_startup_timeout=int(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", 180))):
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            yield


@pytest.fixture
def prefect_home(tmp_path, tmp_path_factory) -> Path:
    """A ``PREFECT_HOME`` for a subprocess that starts its own temporary Prefect API, holding a
    migrated database as a user's does after their first run (tests/support/prefect_db.py)."""
    from tests.support.prefect_db import seed_home

    return seed_home(tmp_path / "prefect", tmp_path_factory)


@pytest.fixture(scope="session")
def local_ray():
    """A real local Ray, told the machine's real CPU count (as ``keynes run`` starts it)."""
    import ray

    from tasks.pool import ensure_ray, stop_ray

    ensure_ray()
    yield ray
    stop_ray()


#: The session's one quickstart run: the shipped config (Gemma 3 270M on llama.cpp, basic and chain
#: of thought, 2 actors, shards of 5) with 10 agents instead of 30, so that each round still has two
#: shards per arm, 2 rounds instead of 3 (round 2 already shows each agent its history) and 24
#: reasoning tokens instead of 48 (the reasoning's decode is most of the run's cost). The report,
#: plan and llama.cpp flow tests all read it.
QUICKSTART = REPO / "experiments" / "quickstart.yaml"
#: Every experiment config: the YAML files under experiments/ but the models profiles (design/profiles.py).
EXPERIMENT_CONFIGS = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "experiments").rglob("*.yaml") if p.parent.name != "profiles")
QUICKSTART_AGENTS, QUICKSTART_ROUNDS = 10, 2
QUICKSTART_OVERRIDES = [f"population.size={QUICKSTART_AGENTS}", f"game.rounds={QUICKSTART_ROUNDS}", "arms.max_reasoning_tokens=24"]


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory, prefect_api, local_ray) -> tuple[Path, ExperimentSummary]:
    """The quickstart played once for the session through the real flow (real Gemma, real
    Prefect API, real Ray) into its own DuckDB file, with its report page: (path, summary).
    Tests read it; none writes to it."""
    from flows.experiment import experiment

    path = tmp_path_factory.mktemp("quickstart") / "keynes.duckdb"
    summary = experiment(str(QUICKSTART), QUICKSTART_OVERRIDES, db=str(path))
    return path, summary


@pytest.fixture(scope="session")
def session_cli(prefect_api, local_ray) -> tuple[dict[str, str], str]:
    """For a ``keynes run`` subprocess that is not about start-up itself: an environment that
    points it at the session's Prefect API, and the session's Ray address (for
    ``workers.ray_address``), so that it starts neither."""
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PREFECT_API_URL=PREFECT_API_URL.value(), PREFECT_LOGGING_LEVEL="WARNING", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    return env, local_ray.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def vllm_engine():
    """The session's in-process vLLM engine for a model: ``vllm_engine("gemma-3-270m")`` loads it
    on first use and returns the same engine after; asking for another model closes it first
    (tests/support/vllm.py). Fails at teardown if a model was loaded twice in one process."""
    from tests.support.vllm import VllmEngines

    engines = VllmEngines()
    yield engines
    engines.close()
    engines.stop_server()
    models = [model for model, _ in engines.loads]
    assert len(models) == len(set(models)), f"vLLM engines loaded in this process: {engines.loads}; each model should load once"
    assert len(engines.server_starts) <= 1, f"vLLM servers started in this process: {engines.server_starts}; the server should start once"


@pytest.fixture(scope="module")
def vllm_server(vllm_engine, tmp_path_factory):
    """The session's vLLM OpenAI server of Gemma 3 270M, with the exact path's flags and an API key
    (``VLLM_KEY_ENV``), started on first use; it takes the in-process engine's slot (tests/support/vllm.py)."""
    return vllm_engine.serve(tmp_path_factory.getbasetemp() / "vllm-server.log")


#: Modules that share a heavy fixture run on one pytest-xdist worker (the suite runs on two), so
#: the fixture is built once: the quickstart's readers, and every module that starts vLLM (model
#: preparation, the session's in-process engine ``vllm_engine``). Every other module is a unit of
#: its own, so its module-scoped fixtures (a server, a cluster, an engine) are built on one worker only.
SHARED = {
    "quickstart": ("tests/engines/test_llamacpp.py", "tests/flows/test_plan.py", "tests/reports/test_report.py",
                   "tests/flows/test_experiments_configs.py", "tests/test_doc_commands.py", "tests/reports/test_llm_pools.py"),
    # Both start a stack's runner; test_warm_stack edits a module's time stamp, which ends any runner alive.
    "warm": ("tests/flows/test_warm_stack.py", "tests/benchmarks/test_warm_start_smoke.py"),
    "vllm": ("tests/engines/test_vllm.py", "tests/engines/test_vllm_chat.py", "tests/benchmarks/test_vllm_throughput_smoke.py",
             "tests/engines/test_openai_vllm.py", "tests/engines/test_openai_hosted.py", "tests/flows/test_paper_served.py",
             "tests/benchmarks/test_served_smoke.py"),
}


_GROUP_OF = {module: group for group, modules in SHARED.items() for module in modules}

#: Roughly how long the longest scopes take on a worker (seconds, setup and calls, from a suite
#: run's ``--durations``): they are handed out first, so that no long one is left for the end
#: while the other worker idles. Other modules follow in pytest-randomly's order.
WEIGHTS = {
    "quickstart": 520, "vllm": 920, "tests/flows/test_deploy.py": 230, "tests/reliability/test_resume_and_readers.py": 130,
    "tests/benchmarks/test_shared_context_smoke.py": 100, "tests/engines/test_openai.py": 100,
    "tests/flows/test_shared_context.py": 70, "tests/reports/test_deployment_runs.py": 80, "tests/reports/test_depth_report.py": 70,
    "tests/flows/test_temporary_api.py": 66, "tests/benchmarks/test_chaos_smoke.py": 62, "tests/engines/test_llamacpp_batch.py": 60,
    "tests/tasks/test_personas.py": 60, "tests/reliability/test_disk_full.py": 59, "tests/reliability/test_engine_faults.py": 58,
    "tests/engines/test_prompt_formats.py": 58, "tests/benchmarks/test_cold_start_smoke.py": 44,
    "tests/benchmarks/test_shard_size_smoke.py": 180, "warm": 190,
    "tests/benchmarks/test_cli_start_smoke.py": 75, "tests/cli/test_starts.py": 75, "tests/flows/test_shard_resume.py": 60,
    "tests/keynes/test_notebook.py": 50,
    "tests/engines/test_openai_llamacpp.py": 400,
}


def scope_of(nodeid: str) -> str:
    """The unit one worker runs whole: a module, or its SHARED group."""
    module = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(module, module)


def pytest_configure(config):
    config.addinivalue_line("markers", "needs(component, available, how): the test needs a component "
                            "(tests/support/requirements.py: skipped where it is missing, failed under CI)")


def pytest_runtest_setup(item):
    """Tests marked ``needs`` whose component is missing: skipped, or failed under CI."""
    from tests.support.requirements import require

    for mark in item.iter_markers("needs"):
        require(mark.kwargs["available"], mark.args[0], mark.kwargs["how"])


#: Modules that run after the rest of their SHARED group, in this order: the vLLM server takes the
#: in-process engine's slot (one vLLM at a time, ``vllm_engine``), so it starts once Gemma's in-process
#: modules are done (test_openai_vllm.py's reference included), serves the hosted preset's module,
#: the paper's configs and benchmark (f) next, and SmolLM2's engine loads after it; each model and the server load once.
LAST_IN_GROUP = {"tests/engines/test_openai_vllm.py": 1, "tests/engines/test_openai_hosted.py": 1.5, "tests/flows/test_paper_served.py": 1.6,
                 "tests/benchmarks/test_served_smoke.py": 1.7,
                 "tests/engines/test_vllm_chat.py": 2}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The heaviest scopes first (``WEIGHTS``), each scope's tests kept in pytest-randomly's order
    (but ``LAST_IN_GROUP``'s modules after the rest of their group)."""
    items.sort(key=lambda item: (-WEIGHTS.get(scope_of(item.nodeid), 0), LAST_IN_GROUP.get(item.nodeid.split("::", 1)[0], 0)))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling with SHARED's groups and modules as the scopes, handed out in
    collection order (``pytest_collection_modifyitems``: the heaviest first)."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModulesAndSharedFixtures(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return ModulesAndSharedFixtures(config, log)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A fresh DuckDB file path."""
    return tmp_path / "keynes.duckdb"


@pytest.fixture(autouse=True)
def _prefect_settings_unchanged():
    """A test that leaves Prefect pointed at another API (a settings context it entered and
    never left) fails itself, instead of every later test that talks to the session's API."""
    import sys

    def api() -> str | None:
        if "prefect.settings" not in sys.modules:
            return None
        from prefect.settings import PREFECT_API_URL

        return PREFECT_API_URL.value()

    before = api()
    yield
    after = api()
    assert before is None or after == before, f"the test left PREFECT_API_URL at {after} (was {before})"
