"""docs/notebooks/results.ipynb runs in a real Jupyter kernel (nbclient, ipykernel) while a real
``keynes run`` writes the same warehouse file, and both finish.

The notebook starts once the run has stored its first round, and follows it to the end: its progress
cell prints the rounds stored each time the count changes, so the test sees that it read the file
while the run wrote it. The run's lock timeout is shortened to ``LOCK_TIMEOUT_S``: a notebook that
held the file that long would make it fail. The kernel keeps the default (60 s), as a user's does:
its queries wait while the run keeps the file for a round's bookkeeping.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

import keynes
from tests.conftest import REPO

pytestmark = pytest.mark.slow  # a whole `keynes run` (simulated engine) and a Jupyter kernel

NOTEBOOK = REPO / "docs" / "notebooks" / "results.ipynb"
N, ROUNDS, SHARD, LATENCY_S = 120, 5, 20, 0.4  # ~4 s a round for two arms on two actors
ARMS = 2  # the quickstart's two prompt modes
LOCK_TIMEOUT_S = 15


def outputs(notebook, tag: str) -> str:
    """Everything a tagged cell printed or displayed, as text."""
    (cell,) = [c for c in notebook.cells if tag in c.metadata.get("tags", [])]
    texts = [o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "") for o in cell.outputs]
    return "\n".join(texts)


def test_the_notebook_runs_in_a_kernel_while_keynes_run_writes_the_same_file(tmp_path, session_cli):
    env, ray_address = session_cli
    db = tmp_path / "keynes.duckdb"
    log = (tmp_path / "run.log").open("w")
    started = time.monotonic()
    writer = subprocess.Popen(
        [sys.executable, "-m", "cli.app", "run", str(REPO / "experiments/quickstart.yaml"), "--db", str(db),
         "--set", f"population.size={N}", "--set", f"game.rounds={ROUNDS}", "--set", f"workers.shard_size={SHARD}",
         "--set", f"arms.engines=[{{kind: simulated, latency_s: {LATENCY_S}}}]", "--set", "report.enabled=false",
         "--set", f"workers.ray_address={ray_address}"],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**env, "KEYNES_LOCK_TIMEOUT_S": str(LOCK_TIMEOUT_S)},
    )
    try:
        # The notebook starts once a round is stored and the run is still writing.
        deadline = time.monotonic() + 300
        while True:
            assert writer.poll() is None, f"the run ended before the notebook started: {(tmp_path / 'run.log').read_text()[-3000:]}"
            stored = keynes.query("select count(*) from rounds", db=db).item() if db.exists() else 0
            if stored >= 1:
                break
            assert time.monotonic() < deadline, "no round stored after 300 s"
            time.sleep(0.2)
        assert stored < ARMS * ROUNDS
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        kernel_env = {**env, "PYTHONPATH": str(REPO), "KEYNES_DB": str(db)}
        notebook_started = time.monotonic()
        try:  # the progress cell gives up after 600 s by itself
            NotebookClient(notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute(env=kernel_env)
        except (CellExecutionError, CellTimeoutError) as exc:
            pytest.fail(f"the notebook failed ({exc}); the run: {'running' if writer.poll() is None else f'exit {writer.returncode}'}, "
                        f"its output: {(tmp_path / 'run.log').read_text()[-3000:]}")
        notebook_s = time.monotonic() - notebook_started
        writer.wait(timeout=300)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        log.close()
    run_s = time.monotonic() - started
    assert writer.returncode == 0, (tmp_path / "run.log").read_text()[-3000:]

    # The notebook read the file while the run wrote it: it saw rounds stored below the total, then all of them.
    seen = [int(n) for n in re.findall(r"^(\d+) rounds stored", outputs(notebook, "progress"), re.MULTILINE)]
    assert seen and seen[0] < ARMS * ROUNDS and seen[-1] == ARMS * ROUNDS, seen
    assert seen == sorted(seen) and len(seen) >= 2, seen
    # Its results: every arm and round, the answers, the pandas frame.
    assert "shape: (10, 8)" in outputs(notebook, "rounds") and "winning_guess" in outputs(notebook, "rounds")
    assert "distinct_answers" in outputs(notebook, "answers")
    assert "round" in outputs(notebook, "pandas") and "cot" in outputs(notebook, "pandas")
    assert "round_summary" in outputs(notebook, "tables")
    with_guesses = keynes.query("select count(*) from guesses", db=db).item()
    assert with_guesses == N * ROUNDS * ARMS
    print(json.dumps({"run_s": round(run_s, 1), "notebook_s": round(notebook_s, 1), "rounds_seen": seen}))
