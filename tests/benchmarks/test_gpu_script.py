"""benchmarks/gpu.sh needs an NVIDIA GPU (and installs the GPU extra), so it cannot run here; it
has no dry-run mode. What is checked without a GPU: the script parses, and each thing it runs
exists and accepts what the script passes — the extra, the pytest marker and folder, the
benchmark's options, the config with its override, and its final SQL against a real warehouse."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu.sh"


def commands() -> list[list[str]]:
    """The script's ``uv run`` commands, split into words as bash would (a quoted argument may
    span lines)."""
    found, pending = [], ""
    for line in re.sub(r"\\\n\s*", " ", SCRIPT.read_text()).splitlines():
        pending += line + "\n"
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if words[:2] == ["uv", "run"]:
            found.append(words)
        pending = ""
    return found


def keynes(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_the_script_parses_and_names_a_defined_extra():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    runs = commands()
    # Each of these is checked by a test below; a command added to the script needs one too.
    assert [c[4:6] for c in runs] == [["keynes", "models"], ["pytest", "tests/gpu"], ["python", "benchmarks/vllm_throughput.py"],
                                      ["keynes", "run"], ["keynes", "sql"]], runs
    for command in runs:
        assert command[:4] == ["uv", "run", "--extra", "vllm"] and "vllm" in extras, command
    assert "uv sync --extra vllm" in SCRIPT.read_text()


def test_the_gpu_tests_it_runs_are_collected():
    (command,) = [c[4:] for c in commands() if c[4] == "pytest"]
    assert command[:3] == ["pytest", "tests/gpu", "-m"] and command[3] == "gpu"
    collected = subprocess.run([sys.executable, "-m", "pytest", *command[1:], "--collect-only", "-p", "no:randomly"],
                               cwd=REPO, capture_output=True, text=True, timeout=300)
    assert collected.returncode == 0 and re.search(r"^tests/gpu/\S+::test_", collected.stdout, re.MULTILINE), collected.stdout[-2000:]


def test_the_benchmark_accepts_the_scripts_options():
    (command,) = [c[4:] for c in commands() if c[4:6] == ["python", "benchmarks/vllm_throughput.py"]]
    options = [a for a in command[2:] if a.startswith("--")]
    assert options == ["--num-gpus", "--prompts"]
    usage = subprocess.run([sys.executable, "benchmarks/vllm_throughput.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert usage.returncode == 0 and all(o in usage.stdout for o in options), usage.stdout


def test_the_model_it_prepares_is_bundled():
    from engines.models import MODELS

    (command,) = [c[4:] for c in commands() if c[4:7] == ["keynes", "models", "prepare"]]
    assert command[3:] == ["gemma-3-270m"] and command[3] in MODELS
    usage = keynes("models", "prepare", "--help")
    assert usage.returncode == 0, usage.stderr[-2000:]


def test_the_experiment_it_runs_is_a_valid_config():
    from design.loading import load_config

    (command,) = [c[4:] for c in commands() if c[4:6] == ["keynes", "run"]]
    assert command[3:] == ["--db", "$DB", "--set", "workers.actors=$ACTORS"], command
    config = load_config(REPO / command[2], ["workers.actors=4"])  # ACTORS=4 on a 4-GPU machine
    (engine,) = config.arms.engines
    assert engine.kind == "vllm" and engine.num_gpus == 1 and config.workers.actors == 4


def test_its_final_query_runs_on_a_warehouse(tmp_path):
    from warehouse.store import Warehouse

    (command,) = [c[4:] for c in commands() if c[4:6] == ["keynes", "sql"]]
    query = command[-1]
    assert command[2:4] == ["--db", "$DB"] and query.startswith("select"), command
    db = tmp_path / "keynes.duckdb"
    with Warehouse(db).connect():  # the schema a run creates, without its rows
        pass
    answered = keynes("sql", "--db", str(db), query)
    assert answered.returncode == 0, answered.stderr[-2000:]
    for column in ("prompt_mode", "round", "n_valid", "mean", "seconds"):
        assert column in answered.stdout, answered.stdout
