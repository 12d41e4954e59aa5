"""An experiment's recorded inputs and its runs' provenance: their rows, and one line of each.

``experiments.inputs`` holds the digests ``design.inputs`` computes (a rerun's are compared with
them); ``provenance`` holds one row per arm and session (one run of the flow) with what computed
it (``design.provenance``): keynes and its commit, Python and packages, models and templates, the
machine, and when the session started and finished the arm's rounds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

import polars as pl

from warehouse.store import Warehouse

#: The provenance columns stored as JSON.
JSON_COLUMNS = ("packages", "models", "templates", "machine")


@dataclass(frozen=True)
class ProvenanceRow:
    """A ``provenance`` row as a session begins an arm (``finished_at`` and ``rounds`` come at its end)."""

    run_id: str
    session: str
    experiment_id: str
    keynes_version: str | None
    git_commit: str | None
    git_modified: bool | None
    python: str
    packages: dict[str, str]
    models: dict[str, str]
    templates: dict[str, str]
    machine: dict[str, Any]


def recorded_inputs(warehouse: Warehouse, experiment_id: str, read_only: bool = False) -> dict[str, str] | None:
    """The inputs an experiment's first run recorded; None: a new experiment (or file), or one
    recorded before inputs were."""
    if not warehouse.path.exists():
        return None
    with warehouse.connect(read_only=read_only) as con:
        rows = con.execute("SELECT inputs FROM experiments WHERE experiment_id = ?", [experiment_id]).fetchall()
    return json.loads(rows[0][0]) if rows and rows[0][0] else None


def record_inputs(warehouse: Warehouse, experiment_id: str, inputs: dict[str, str]) -> None:
    """Record an experiment's inputs (``design.inputs.check_inputs`` says what: the first run's,
    with names added since)."""
    with warehouse.transaction() as con:
        con.execute("UPDATE experiments SET inputs = ? WHERE experiment_id = ?", [json.dumps(inputs, sort_keys=True), experiment_id])


def begin_provenance(warehouse: Warehouse, rows: list[ProvenanceRow]) -> None:
    """Record what computes each arm a session plays, as it begins (once per arm and session)."""
    names = [f.name for f in fields(ProvenanceRow)]
    with warehouse.transaction() as con:
        for row in rows:
            values = asdict(row)
            con.execute(
                f"INSERT INTO provenance ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) ON CONFLICT DO NOTHING",
                [json.dumps(values[n], sort_keys=True) if n in JSON_COLUMNS else values[n] for n in names],
            )


def finish_provenance(warehouse: Warehouse, run_id: str, session: str, rounds: list[int]) -> None:
    """The session played these rounds of the arm and is done with it."""
    with warehouse.transaction() as con:
        con.execute("UPDATE provenance SET finished_at = now(), rounds = ? WHERE run_id = ? AND session = ?",
                    [rounds, run_id, session])


def provenance_rows(warehouse: Warehouse, experiment_ids: list[str]) -> list[dict[str, Any]]:
    """The provenance rows of these experiments, oldest session first, JSON columns decoded."""
    frame = warehouse.query(
        "SELECT p.*, r.arm FROM provenance p JOIN runs r USING (run_id) WHERE list_contains(?, p.experiment_id) "
        "ORDER BY p.started_at, r.arm", [experiment_ids])
    return [{k: json.loads(v) if k in JSON_COLUMNS and v is not None else v for k, v in row.items()}
            for row in frame.iter_rows(named=True)]


def experiment_row(warehouse: Warehouse, experiment_id: str) -> dict[str, Any]:
    """An experiment's name, status, population and ``created_at`` (it must exist)."""
    return warehouse.query("SELECT name, status, population, created_at FROM experiments WHERE experiment_id = ?",
                           [experiment_id]).row(0, named=True)


def runs_of(warehouse: Warehouse, experiment_ids: list[str] | None = None) -> pl.DataFrame:
    """Experiments and their arms (``keynes show`` without an experiment): experiment id, name,
    status, created_at, arm, run id, engine, model, prompt mode, rounds played and planned."""
    return warehouse.query(
        """SELECT e.experiment_id, e.name, e.status AS experiment_status, e.created_at, r.arm, r.run_id, r.engine, r.model,
                  r.prompt_mode, r.status, (SELECT count(*) FROM rounds d WHERE d.run_id = r.run_id) AS rounds_played, r.rounds
           FROM experiments e LEFT JOIN runs r USING (experiment_id)
           WHERE ? IS NULL OR list_contains(?, e.experiment_id)
           ORDER BY e.created_at DESC, r.arm""", [experiment_ids, experiment_ids])


def sessions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``provenance_rows`` by session, oldest first: one dict per session with its first row's
    software and machine, its arms (``arms``: arm → rounds played, None while unfinished), its
    models' and templates' digests (every arm's), its start and its end (None: unfinished)."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        session = out.setdefault(row["session"], {**row, "arms": {}, "models": {}, "templates": {}})
        session["arms"][row["arm"]] = row["rounds"]
        session["models"].update(row["models"] or {})
        session["templates"].update(row["templates"] or {})
        ends = [session["finished_at"], row["finished_at"]]
        session["finished_at"] = None if None in ends else max(ends)
    return list(out.values())



def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S %Z").strip() if value is not None else "unfinished"


def session_lines(session: dict[str, Any]) -> list[str]:
    """A session of ``sessions`` as ``keynes show`` and the report's footer print it: when, which
    arms and rounds, keynes and its commit, Python, packages, machine, then each model's and
    template's digest."""
    commit = session.get("git_commit")
    source = f"commit {commit}{' (modified checkout)' if session.get('git_modified') else ''}" if commit else "no git checkout"
    machine = session.get("machine") or {}
    arms = ", ".join(f"{arm} (rounds {', '.join(map(str, rounds))})" if rounds else f"{arm} (unfinished)"
                     for arm, rounds in session["arms"].items())
    return [
        f"session {session['session']}: {_when(session['started_at'])} to {_when(session['finished_at'])}; arms {arms}",
        f"  keynes {session.get('keynes_version') or 'unknown'}, {source}; Python {session.get('python')}",
        "  packages: " + (", ".join(f"{k} {v}" for k, v in (session.get("packages") or {}).items()) or "none recorded"),
        (f"  machine: {machine.get('cpu') or 'unknown CPU'}, {machine.get('cores')} cores, vector extensions "
         f"{' '.join(machine.get('vector_extensions') or []) or 'none'}, GPUs {', '.join(machine.get('gpus') or []) or 'none'}, "
         f"{machine.get('memory_gib')} GiB, {machine.get('platform')}"),
        *(f"  {name}: {digest}" for name, digest in {**session["models"], **session["templates"]}.items()),
    ]
