"""Stage 5, report: build the experiment's offline report page.

A run of a deployment writes a file per experiment: each run can be another one (the UI's
overrides). The flow publishes the page's artifacts (``flows.monitor.publish_rounds``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
from prefect import task
from prefect.cache_policies import NONE

from tasks import store


@dataclass(frozen=True)
class ReportWritten:
    """The report stage's result: the page's file and the ``round_summary`` rows it shows."""

    page: Path
    rounds: pl.DataFrame


def page_file(out: str | Path, experiment_id: str) -> Path:
    """Where the report page goes: ``out``; in a run of a deployment, ``<out stem>-<experiment
    id>.html`` beside it, so that runs with other overrides (other experiments) keep their pages."""
    from prefect.runtime import deployment

    path = Path(out)
    return path if deployment.id is None else path.with_name(f"{path.stem}-{experiment_id}{path.suffix or '.html'}")


@task(name="report", task_run_name="report-{experiment_id}", cache_policy=NONE, retries=1, retry_delay_seconds=[5])
def report_stage(db: str, experiment_id: str, out: str) -> ReportWritten:
    """Write the experiment's report page (``page_file``) and read the rounds it shows."""
    from reports.export import write_reports  # Panel loads in seconds: only when a report is built

    warehouse = store.open_warehouse(db)
    with store.held(warehouse):  # the page's two dozen queries on one connection: the run writes nothing meanwhile
        path = write_reports(db, page_file(out, experiment_id), experiment_id)[0]
        rounds = store.round_summary(warehouse, experiment_id)
    return ReportWritten(Path(path), rounds)
