"""``keynes show``: the experiments of a warehouse with their runs, or one experiment's inputs and
provenance (read-only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from cli.common import fail, out
from cli.table import cell, narrow_table


def show(
    experiment: Annotated[Optional[str], typer.Argument(help="An experiment's id or name (its newest); none lists every experiment.")] = None,
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
) -> None:
    """Show an experiment's inputs and what computed each run (keynes, commit, packages, machine,
    models, times); without EXPERIMENT, list every experiment with its runs.

    Example: keynes show quickstart
    """
    from reports.data import ExperimentNotFound, experiment_ids
    from warehouse.store import Warehouse, WarehouseError

    warehouse = Warehouse(db)
    try:
        ids = None if experiment is None else experiment_ids(warehouse, experiment)
        if ids is None:
            _list(warehouse)
        else:
            _one(warehouse, ids[0])
    except (ExperimentNotFound, WarehouseError) as exc:
        fail(str(exc))


def _list(warehouse) -> None:
    """Every experiment, newest first: a line, then a table of its runs (arms)."""
    from warehouse.provenance import runs_of

    rows = runs_of(warehouse)
    if rows.is_empty():
        out.print("no experiment yet", highlight=False)
        return
    for (experiment_id,), runs in rows.group_by("experiment_id", maintain_order=True):
        first = runs.row(0, named=True)
        created = f"{first['created_at']:%Y-%m-%d %H:%M %Z}" if first["created_at"] else "unknown"
        out.print(f"{experiment_id}: {first['name']}, {first['experiment_status']}, created {created}", highlight=False, soft_wrap=True)
        table = narrow_table(show_header=True, header_style="bold", padding=(0, 1, 0, 2))
        for name in ("arm", "model", "prompt mode", "rounds", "status"):
            table.add_column(Text(name), justify="right" if name in ("arm", "rounds") else "left", overflow="fold")
        for run in runs.filter(runs["arm"].is_not_null()).iter_rows(named=True):
            table.add_row(*map(Text, [cell(run["arm"]), cell(run["model"]), cell(run["prompt_mode"]),
                                      f"{run['rounds_played']}/{run['rounds']}", cell(run["status"])]))
        out.print(table)


def _one(warehouse, experiment_id: str) -> None:
    """The experiment, its recorded inputs, then each session's provenance."""
    from warehouse.provenance import experiment_row, provenance_rows, recorded_inputs, session_lines, sessions

    row = experiment_row(warehouse, experiment_id)
    out.print(f"{experiment_id}: {row['name']}, {row['status']}, {row['population']:,} agents, created "
              f"{row['created_at']:%Y-%m-%d %H:%M:%S %Z}", highlight=False, soft_wrap=True)
    inputs = recorded_inputs(warehouse, experiment_id, read_only=True)
    out.print("inputs (a rerun with other ones is refused):" if inputs else "inputs: not recorded yet (the next run records them)",
              highlight=False)
    for name, digest in (inputs or {}).items():
        out.print(f"  {name}: {digest}", highlight=False, soft_wrap=True)
    found = sessions(provenance_rows(warehouse, [experiment_id]))
    if not found:
        out.print("provenance: none recorded (its rounds were played before keynes recorded provenance)", highlight=False)
    for session in found:
        for line in session_lines(session):
            out.print(line, highlight=False, soft_wrap=True)
