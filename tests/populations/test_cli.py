"""`keynes personas`: exact quotas, reproducible stored populations, one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

from tests.conftest import REPO


def keynes(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "cli.app", "personas", *args],
        capture_output=True, text=True, cwd=REPO, timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},  # wide enough that rich never wraps a line
    )


def personas(path) -> list[tuple]:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("select * exclude (experiment_id) from personas order by agent_id").fetchall()


def test_education_1000_gives_exactly_200_per_level(tmp_path):
    result = keynes("populations/education.yaml", "--n", "1000", "--db", str(tmp_path / "a.duckdb"))
    assert result.returncode == 0, result.stderr
    levels = ["Elementary School", "High School", "Bachelor's Degree", "Master's Degree", "Ph.D."]
    for level in levels:
        line = next(line for line in result.stdout.splitlines() if f" {level} " in line)
        assert [cell.strip() for cell in line.split("│")[3:6]] == ["0.2000", "0.2000", "200"], line
    with duckdb.connect(str(tmp_path / "a.duckdb"), read_only=True) as con:
        counts = con.execute("select education, count(*) from personas group by all").fetchall()
    assert sorted(counts) == sorted((level, 200) for level in levels)


def test_same_seed_same_population_other_seed_differs(tmp_path):
    runs = {}
    for label, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        path = tmp_path / f"{label}.duckdb"
        result = keynes("adults.yaml", "--n", "300", "--seed", seed, "--db", str(path))
        assert result.returncode == 0, result.stderr
        runs[label] = personas(path)
    assert len(runs["a"]) == 300
    assert runs["a"] == runs["b"]
    assert runs["a"] != runs["c"]


@pytest.mark.parametrize(
    "spec, args, message",
    [
        ("education:\n  A: 0.5\n  B: 0.7\n", [], "bad.yaml: attributes.education.shares: shares sum to 1.2, expected 1.0"),
        (
            "education: {A: 0.5, B: 0.5}\noccupation:\n  given: education\n  shares:\n    A: {Clerk: 1}\n    C: {Clerk: 1}\n",
            [],
            "bad.yaml: attributes.occupation.shares.C: unknown value of parent 'education'; known: A, B",
        ),
        ("age: {distribution: poisson, mean: 3}\n", [], "bad.yaml: attributes.age.distribution: unknown distribution 'poisson'; available: histogram, normal, truncnormal, uniform"),
        ("education: {A: 1}\n", ["--n", "0"], "--n: population size must be positive, got 0"),
        ("education: {A: 1}\n", ["--n", "-5"], "--n: population size must be positive, got -5"),
    ],
)
def test_errors_exit_2_with_one_line_and_write_nothing(tmp_path, spec, args, message):
    path = tmp_path / "bad.yaml"
    path.write_text("attributes:\n" + "".join(f"  {line}\n" for line in spec.splitlines()))
    db = tmp_path / "k.duckdb"
    result = keynes(str(path), *args, "--db", str(db), timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith(message), result.stderr
    assert result.stdout == ""
    assert not db.exists()
