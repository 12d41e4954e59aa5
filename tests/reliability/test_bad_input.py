"""Fault 6: bad input to ``keynes run``. One clear line, exit 2, nothing written.

Each case runs the real ``keynes run`` command (in process, through typer's runner; the
held-file case uses a second process as the other writer) and checks that the warehouse
file was not created, or is byte for byte unchanged.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cli import invoke

GOOD = {
    "name": "bad-input",
    "population": {"spec": "education.yaml", "size": 20},
    "game": {"rounds": 1},
    "arms": {"engines": [{"kind": "simulated"}]},
}


def run_keynes(config: Path, db: Path, *extra: str):
    result, lines = invoke("run", str(config), "--db", str(db), *extra)
    return result.exit_code, lines


def write(tmp_path: Path, data: dict | str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def with_(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


CASES = {
    "malformed YAML": ("name: x\ngame:\n  ratio: [2/3\n  rounds: 3\n", ["exp.yaml: line 4, column 9: invalid YAML"]),
    "tab in YAML": ("name: x\npopulation:\n\tsize: 3\n", ["line 3, column 1: invalid YAML"]),
    "not a mapping": ("- just\n- a list\n", ["expected a mapping of settings, got list"]),
    "unknown top-level key": (dict(GOOD, worker={"actors": 2}), ["worker: unknown key (did you mean 'workers'?)"]),
    "unknown nested key": (with_(game__rouns=3), ["game.rouns: unknown key (did you mean 'rounds'?)"]),
    "unknown engine setting": (with_(arms__engines=[{"kind": "simulated", "latency": 1}]),
                               ["arms.engines.0.latency: unknown key (did you mean 'latency_s'?)"]),
    "size not a number": (with_(population__size="lots"), ["population.size: 'lots': input should be a valid integer"]),
    "rounds a list": (with_(game__rounds=[1]), ["game.rounds: [1]: input should be a valid integer"]),
    "temperature a word": (with_(arms__temperatures=["hot"]), ["arms.temperatures.0: 'hot'"]),
    "shares do not sum to 1": (with_(population={"attributes": {"education": {"a": 0.5, "b": 0.4}}, "size": 10}),
                               ["population.attributes.education.shares: shares sum to 0.9, expected 1.0"]),
    "negative share": (with_(population={"attributes": {"education": {"a": 1.5, "b": -0.5}}, "size": 10}),
                       ["population.attributes.education.shares: share -0.5 is negative"]),
    "unknown population spec": (with_(population__spec="nowhere.yaml"), ["population.spec: nowhere.yaml: no such population spec"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_is_one_line_exit_2_and_writes_nothing(case, tmp_path):
    data, expected = CASES[case]
    db = tmp_path / "out" / "keynes.duckdb"
    db.parent.mkdir()
    code, lines = run_keynes(write(tmp_path, data), db)
    assert code == 2 and len(lines) == 1, lines
    assert all(part in lines[0] for part in expected), lines[0]
    assert list(db.parent.iterdir()) == []


def test_bad_shares_in_a_spec_file_name_the_file(tmp_path):
    spec = write(tmp_path, "attributes:\n  education: {a: 0.5, b: 0.4}\n", "people.yaml")
    db = tmp_path / "keynes.duckdb"
    code, lines = run_keynes(write(tmp_path, with_(population__spec=str(spec))), db)
    assert code == 2 and len(lines) == 1
    assert lines[0].endswith(f"population.spec: {spec}: attributes.education.shares: shares sum to 0.9, expected 1.0"), lines[0]
    assert not db.exists()


def test_missing_db_directory(tmp_path):
    db = tmp_path / "nowhere" / "keynes.duckdb"
    code, lines = run_keynes(write(tmp_path, GOOD), db)
    assert code == 2 and len(lines) == 1 and f"directory '{db.parent}' does not exist" in lines[0]
    assert not db.parent.exists()


def unwritable_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in (root ignores modes: use sysfs)."""
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        return locked
    return Path("/sys")


def test_unwritable_db_directory(tmp_path):
    directory = unwritable_directory(tmp_path)
    before = sorted(p.name for p in directory.iterdir())
    code, lines = run_keynes(write(tmp_path, GOOD), directory / "keynes.duckdb")
    assert code == 2 and len(lines) == 1 and f"directory '{directory}' is not writable" in lines[0], lines
    assert sorted(p.name for p in directory.iterdir()) == before


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_db_that_is_not_a_duckdb_file_is_left_alone(tmp_path):
    db = tmp_path / "notes.duckdb"
    db.write_text("my notes, not a database\n")
    code, lines = run_keynes(write(tmp_path, GOOD), db)
    assert code == 2 and len(lines) == 1 and "not a valid DuckDB database file" in lines[0], lines
    assert db.read_text() == "my notes, not a database\n"


def test_db_held_by_another_writer_waits_then_exits_2_unchanged(tmp_path, monkeypatch):
    from warehouse.store import Warehouse

    db = tmp_path / "held.duckdb"
    with Warehouse(db).connect() as con:  # a real keynes warehouse (schema only)
        con.execute("CHECKPOINT")
    before = digest(db)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys, time; con = duckdb.connect(sys.argv[1]); "
         "print('holding', flush=True); time.sleep(120)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        monkeypatch.setenv("KEYNES_LOCK_TIMEOUT_S", "1.5")
        start = time.monotonic()
        code, lines = run_keynes(write(tmp_path, GOOD), db)
        waited = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert code == 2 and len(lines) == 1, lines
    assert "held by another process for over 1.5 s" in lines[0]
    assert 1.5 <= waited < 60
    assert digest(db) == before
    # Once the other writer is gone the same file works.
    from warehouse.store import Warehouse as W

    W(db, lock_timeout_s=5).check_writable()


def test_bad_override_value_type(tmp_path):
    db = tmp_path / "keynes.duckdb"
    code, lines = run_keynes(write(tmp_path, GOOD), db, "--set", "workers.actors=two")
    assert code == 2 and len(lines) == 1 and "workers.actors: 'two': input should be a valid integer" in lines[0]
    assert not db.exists()


def test_missing_config_file(tmp_path):
    db = tmp_path / "keynes.duckdb"
    code, lines = run_keynes(tmp_path / "nope.yaml", db)
    assert code == 2 and len(lines) == 1 and "nope.yaml: no such config file" in lines[0]
    assert not db.exists()
