"""Stage 5, report: build the experiment's offline report page and publish Prefect artifacts.

A markdown artifact summarises each round of each arm (from the ``round_summary`` view);
a link artifact points at the saved HTML file (unless ``keynes serve`` runs a report server:
then the flow links the live page instead).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NONE

from reports.urls import report_base_url
from tasks.artifacts import artifact_key, safely
from warehouse.store import Warehouse


def rounds_markdown(rounds: pl.DataFrame, experiment: str, report: Path | None = None) -> str:
    """A markdown summary: one table per arm, one row per round."""
    lines = [f"# {experiment}: rounds", ""]
    if report is not None:
        lines += [f"Report: [{report.name}]({report.resolve().as_uri()})", ""]
    for (arm,), frame in rounds.group_by("arm", maintain_order=True):
        first = frame.row(0, named=True)
        lines += [
            f"## Arm {arm}: {first['prompt_mode']} · {first['model']} ({first['engine']}) · {first['rule']}",
            "",
            "| round | agents | valid | mean | median | sd | target | winning number | winners | distance to equilibrium |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in frame.iter_rows(named=True):
            cells = [r["round"], r["n"], r["n_valid"], r["mean"], r["median"], r["sd"], r["target"], r["winning_guess"],
                     r["n_winners"], r["distance_to_equilibrium"]]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else f"{value:,}" if isinstance(value, int) else str(value)


@task(name="report", cache_policy=NONE, retries=1, retry_delay_seconds=[5])
def report_stage(db: str, experiment_id: str, out: str) -> str:
    """Write the experiment's report page and publish its artifacts (a rounds summary and
    one link to the page); return the file path."""
    from reports.export import write_reports  # Panel loads in seconds: only when a report is built

    path = write_reports(db, out, experiment_id)[0]
    rounds = Warehouse(db).round_summary(experiment_id)
    key = artifact_key(experiment_id)
    safely("create the rounds artifact", lambda: create_markdown_artifact(
        markdown=rounds_markdown(rounds, experiment_id, path), key=f"{key}-rounds",
        description=f"Round summary of {experiment_id}"))
    if report_base_url() is None:  # with a report server, the flow linked the live page already
        safely("create the report link", lambda: create_link_artifact(
            link=path.resolve().as_uri(), link_text=f"Report: {path.name}", key=f"{key}-report",
            description=f"Report page of {experiment_id} (a file on the machine that ran the flow)"))
    return str(path)
