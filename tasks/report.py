"""Stage 5, report: build the experiment's offline report page and publish Prefect artifacts.

A markdown artifact summarises each round of each arm (from the ``round_summary`` view) and
links the experiment's live page when ``keynes serve`` runs a report server (the flow linked
that page already, under the report key); without one, both name the saved HTML file, a file
on the machine that ran the flow, which a browser will not open from the UI's http page. A run
of a deployment writes a file per experiment: each run can be another one (the UI's overrides).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from reports.urls import page_url, report_base_url
from tasks import store
from tasks.artifacts import artifact_key, safely


def rounds_markdown(rounds: pl.DataFrame, experiment: str, report: Path | None = None, live_url: str | None = None) -> str:
    """A markdown summary: one table per arm, one row per round, after a link to the live
    page (``live_url``) or else the path of the report file."""
    lines = [f"# {experiment}: rounds", ""]
    if live_url is not None:
        lines += [f"Report: [{experiment} (live)]({live_url})", ""]
    elif report is not None:
        lines += [f"Report: `{report.resolve()}` (on the machine that ran the flow)", ""]
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


def page_file(out: str | Path, experiment_id: str) -> Path:
    """Where the report page goes: ``out``; in a run of a deployment, ``<out stem>-<experiment
    id>.html`` beside it, so that runs with other overrides (other experiments) keep their pages."""
    from prefect.runtime import deployment

    path = Path(out)
    return path if deployment.id is None else path.with_name(f"{path.stem}-{experiment_id}{path.suffix or '.html'}")


@task(name="report", task_run_name="report-{experiment_id}", cache_policy=NONE, retries=1, retry_delay_seconds=[5])
def report_stage(db: str, experiment_id: str, out: str) -> str:
    """Write the experiment's report page (``page_file``) and publish its artifacts: a rounds
    summary, and without a report server the page's path; return the file path."""
    from reports.export import write_reports  # Panel loads in seconds: only when a report is built

    warehouse = store.open_warehouse(db)
    with store.held(warehouse):  # the page's two dozen queries on one connection: the run writes nothing meanwhile
        path = write_reports(db, page_file(out, experiment_id), experiment_id)[0]
        rounds = store.round_summary(warehouse, experiment_id)
    key = artifact_key(experiment_id)
    base = report_base_url()
    live = page_url(base, experiment_id) if base else None
    safely("create the rounds artifact", lambda: create_markdown_artifact(
        markdown=rounds_markdown(rounds, experiment_id, path, live), key=f"{key}-rounds",
        description=f"Round summary of {experiment_id}"))
    if live is None:  # with a report server, the flow linked the live page already
        safely("create the report artifact", lambda: create_markdown_artifact(
            markdown=f"Report page of {experiment_id}: `{path.resolve()}`, a file on the machine that ran the flow "
                     f"(open it there, or serve live pages: `keynes report --serve --db {db}`)",
            key=f"{key}-report", description=f"Report page of {experiment_id}"))
    return str(path)
