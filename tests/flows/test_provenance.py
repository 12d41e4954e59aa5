"""Provenance on every run: one real run of the flow (simulated engine, real Prefect API, Ray and
DuckDB) records its inputs and, per arm, what computed it; `keynes show`, the report's footer and
`keynes export` give it back; a rerun with an edited template is refused, an untouched one resumes."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import polars as pl
import pytest

from design.config import ConfigError
from design.provenance import packages
from flows.experiment import experiment
from tests.support.cli import invoke
from tests.support.sql import q

pytestmark = pytest.mark.slow

PROVENANCE = ("run_id", "session", "experiment_id", "started_at", "finished_at", "rounds", "keynes_version", "git_commit",
              "git_modified", "python", "packages", "models", "templates", "machine")


@pytest.fixture(scope="module")
def played(tmp_path_factory, prefect_api, local_ray):
    """A two-arm experiment (a built-in mode and the user's own template, which includes a file
    beside it) played once: (config, warehouse path, summary)."""
    folder = tmp_path_factory.mktemp("provenance")
    (folder / "_mine.j2").write_text("Pick a number.")
    (folder / "mine.j2").write_text('{% include "_rules.j2" %}\n{% include "_mine.j2" %}\nMy number is:')
    config = {
        "name": "provenance", "seed": 3,
        "population": {"spec": "education.yaml", "size": 20},
        "game": {"rounds": 2},
        "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", {"name": "mine", "template": str(folder / "mine.j2"), "reasoning": False}]},
        "workers": {"actors": 1, "shard_size": 10},
        "report": {"enabled": False},
    }
    path = folder / "keynes.duckdb"
    summary = experiment(config, db=str(path))
    return config, folder, path, summary


def test_each_arm_has_its_provenance(played):
    _, folder, path, summary = played
    assert summary.complete and summary.rounds_played == 4
    rows = q(path, f"select {', '.join(PROVENANCE)} from provenance order by run_id")
    assert len(rows) == 2
    for row in rows:
        got = dict(zip(PROVENANCE, row))
        assert got["experiment_id"] == summary.experiment_id and got["rounds"] == [1, 2]
        assert got["started_at"] <= got["finished_at"]
        assert got["keynes_version"] == metadata.version("keynes") and got["python"] == platform.python_version()
        assert len(got["git_commit"]) == 40 and isinstance(got["git_modified"], bool)  # the suite runs from a checkout
        assert json.loads(got["packages"]) == packages() and {"duckdb", "prefect", "ray", "numpy", "polars"} <= json.loads(got["packages"]).keys()
        machine = json.loads(got["machine"])
        assert machine["cores"] >= 1 and machine["cpu"] and isinstance(machine["vector_extensions"], list) and machine["gpus"] == []
        templates = json.loads(got["templates"])
        assert "template prompts/_rules.j2" in templates and all(v.startswith("sha256:") for v in templates.values())
    mine = json.loads(rows[1][PROVENANCE.index("templates")])
    assert f"template {folder / 'mine.j2'}" in mine and f"template {folder / '_mine.j2'}" in mine
    assert len({r[1] for r in rows}) == 1  # one session


def test_the_inputs_are_recorded_with_the_experiment(played):
    _, folder, path, _ = played
    inputs = json.loads(q(path, "select inputs from experiments")[0][0])
    assert {f"template {folder / 'mine.j2'}", f"template {folder / '_mine.j2'}", "template prompts/basic.j2",
            "template prompts/_rules.j2", "template prompts/_persona.j2"} == set(inputs)


def test_keynes_show_lists_experiments_and_prints_one(played):
    _, _, path, summary = played
    result, _ = invoke("show", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert summary.experiment_id in result.stdout and "mine" in result.stdout and "2/2" in result.stdout
    result, _ = invoke("show", "provenance", "--db", str(path))
    assert result.exit_code == 0, result.output
    text = result.stdout
    for part in (f"keynes {metadata.version('keynes')}, commit ", f"Python {platform.python_version()}", f"duckdb {packages()['duckdb']}",
                 "machine: ", " cores", "arms 0 (rounds 1, 2), 1 (rounds 1, 2)", "template prompts/basic.j2: sha256:",
                 "inputs (a rerun with other ones is refused):"):
        assert part in text, text
    result, lines = invoke("show", "nothing-like-it", "--db", str(path))
    assert result.exit_code == 2 and len(lines) == 1 and "not found" in lines[0]


def test_keynes_export_writes_the_provenance(played, tmp_path):
    _, _, path, _ = played
    result, _ = invoke("export", "--db", str(path), str(tmp_path))
    assert result.exit_code == 0, result.output
    exported = pl.read_parquet(tmp_path / "provenance.parquet")
    assert exported.height == 2 and set(PROVENANCE) <= set(exported.columns)
    assert "inputs" in pl.read_parquet(tmp_path / "experiments.parquet").columns


def test_the_report_footer_shows_it(played):
    from reports.app import provenance_footer
    from reports.data import ReportData
    from warehouse.store import Warehouse

    _, _, path, summary = played
    footer = "\n".join(str(pane.object) for pane in provenance_footer(ReportData(Warehouse(path), summary.experiment_id)))
    assert "## Provenance" in footer and f"keynes {metadata.version('keynes')}, commit " in footer and f"Python {platform.python_version()}" in footer
    assert "template prompts/basic.j2: sha256:" in footer


def test_an_edited_include_is_refused_and_an_untouched_rerun_resumes(played):
    config, folder, path, summary = played
    again = experiment(config, db=str(path))
    assert again.rounds_played == 0 and again.message and "nothing to play" in again.message
    before = q(path, "select count(*) from provenance")
    include = folder / "_mine.j2"
    text = include.read_text()
    include.write_text(text + " Any number.")
    try:
        with pytest.raises(ConfigError, match=f"{include} changed since experiment {summary.experiment_id} was first run"):
            experiment(config, db=str(path))
    finally:
        include.write_text(text)
    assert q(path, "select count(*) from provenance") == before
