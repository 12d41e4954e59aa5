"""What a long run shows in the Prefect UI: live progress, round outcomes, Ray workers, links.

Progress artifacts follow each round of each arm as shards are committed (through the
``tasks.progress`` hook, throttled); a markdown artifact reports every round; a table
artifact lists the Ray workers in use, read from the warehouse's ``shards`` table.
Monitoring never fails a run: an artifact the API refuses is logged and skipped.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable
from uuid import UUID

import polars as pl
from prefect.artifacts import (
    create_link_artifact,
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate

from core.game import RoundOutcome
from design.arms import Arm
from flows.prefect_internals import table_artifact_data
from reports.urls import page_url, report_base_url
from tasks import progress, store
from tasks.store import Warehouse

log = logging.getLogger(__name__)


def artifact_key(*parts: object) -> str:
    """An artifact key from parts: lowercase letters, digits and dashes only (Prefect's rule)."""
    text = "-".join(str(p) for p in parts).lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text)).strip("-")


def safely(what: str, make: Callable[[], Any]) -> Any:
    """Call ``make``; if the API refuses (or is away), log a warning and return None."""
    try:
        return make()
    except Exception as exc:  # the API being away must not stop 10,000 agents from playing
        log.warning("could not %s: %s", what, exc)
        return None



#: Least seconds between two updates of one progress artifact (a million agents commit thousands of shards).
PROGRESS_INTERVAL_S = 1.0


# ------------------------------------------------------------------------------ progress
class ArtifactProgress:
    """A ``tasks.progress`` reporter: one Prefect progress artifact per round of each arm.

    Args:
        min_interval_s: least seconds between two updates of one artifact; the last
            update (all agents done) is always sent.
    """

    def __init__(self, min_interval_s: float = PROGRESS_INTERVAL_S):
        self.min_interval_s = min_interval_s

    def start(self, label: str, total: int, completed: int = 0) -> "_ArtifactBar":
        return _ArtifactBar(label, total, completed, self.min_interval_s)


class _ArtifactBar:
    def __init__(self, label: str, total: int, completed: int, min_interval_s: float):
        self.label, self.total, self.done = label, total, completed
        self.min_interval_s = min_interval_s
        self.last = time.monotonic()
        self.artifact_id: UUID | None = safely(
            "create a progress artifact",
            lambda: create_progress_artifact(
                progress=self.percent, key=artifact_key("progress", label), description=self.description
            ),
        )

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    @property
    def description(self) -> str:
        return f"**{self.label}**: {self.done:,} of {self.total:,} agents played ({self.percent:.0f} %)"

    def advance(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self.last >= self.min_interval_s or self.done >= self.total:
            self._send()

    def finish(self) -> None:
        self._send()

    def _send(self) -> None:
        self.last = time.monotonic()
        if self.artifact_id is not None:
            safely(
                "update a progress artifact",
                lambda: update_progress_artifact(self.artifact_id, progress=self.percent, description=self.description),
            )


class Fanout:
    """A reporter that forwards to several (the CLI's progress bars and the Prefect UI)."""

    def __init__(self, *reporters: progress.Reporter):
        self.reporters = reporters

    def start(self, label: str, total: int, completed: int = 0) -> "_FanoutBar":
        return _FanoutBar([r.start(label, total, completed) for r in self.reporters])


class _FanoutBar:
    def __init__(self, bars: list[progress.Bar]):
        self.bars = bars

    def advance(self, n: int) -> None:
        for bar in self.bars:
            bar.advance(n)

    def finish(self) -> None:
        for bar in self.bars:
            bar.finish()


# ------------------------------------------------------------------------------ rounds
def outcome_markdown(arm: Arm, round_: int, result: RoundOutcome, seconds: float, max_winners: int = 10) -> str:
    """A round's outcome as markdown: mean, target, winners, invalid rate."""
    rule = arm.rule
    winners = ", ".join(str(int(a)) for a in result.winners[:max_winners])
    if result.n_winners > max_winners:
        winners += f", … ({result.n_winners - max_winners:,} more)"
    offset = f" + {rule.offset:g}" if rule.offset else ""
    return "\n".join([
        f"### {arm.run_id} · round {round_} of {rule.rounds}",
        "",
        f"{arm.engine.model_name} · prompt `{arm.prompt_mode}` · temperature {arm.temperature:g}",
        "",
        "| | |",
        "|---|---|",
        f"| agents | {result.n:,} |",
        f"| valid guesses | {result.n_valid:,} (invalid rate {result.invalid_rate:.1%}) |",
        f"| mean | {_num(result.mean)} |",
        f"| median | {_num(result.median)} |",
        f"| target ({rule.ratio} × mean{offset}) | {_num(result.target)} |",
        f"| winning guess | {_num(result.winning_guess)} |",
        f"| winners | {result.n_winners:,}: agents {winners or '–'} |",
        f"| seconds | {seconds:.1f} |",
    ])


def publish_round(arm: Arm, round_: int, result: RoundOutcome, seconds: float) -> None:
    """A markdown artifact with a round's outcome (one key per arm and round)."""
    safely(
        "create the round artifact",
        lambda: create_markdown_artifact(
            markdown=outcome_markdown(arm, round_, result, seconds),
            key=artifact_key(arm.run_id, "round", round_),
            description=f"{arm.run_id} round {round_}: outcome",
        ),
    )


def rounds_markdown(rounds: pl.DataFrame, experiment: str, report: Path | None = None, live_url: str | None = None) -> str:
    """A markdown summary of ``round_summary`` rows: one table per arm, one row per round, after a
    link to the live page (``live_url``) or else the path of the report file."""
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
            lines.append("| " + " | ".join(_num(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def publish_rounds(db: str, experiment_id: str, page: Path, rounds: pl.DataFrame) -> None:
    """The report stage's artifacts: the rounds summary and, without a report server (whose live
    page the flow linked as it started, ``publish_report``), the written page's path."""
    key = artifact_key(experiment_id)
    base = report_base_url()
    live = page_url(base, experiment_id) if base else None
    safely("create the rounds artifact", lambda: create_markdown_artifact(
        markdown=rounds_markdown(rounds, experiment_id, page, live), key=f"{key}-rounds",
        description=f"Round summary of {experiment_id}"))
    if live is None:
        safely("create the report artifact", lambda: create_markdown_artifact(
            markdown=f"Report page of {experiment_id}: `{page.resolve()}`, a file on the machine that ran the flow "
                     f"(open it there, or serve live pages: `keynes report --serve --db {db}`)",
            key=f"{key}-report", description=f"Report page of {experiment_id}"))


def _num(value: object) -> str:
    """A round statistic in a table cell: counts with separators, other numbers to 4 significant digits."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


# ------------------------------------------------------------------------------ workers
def worker_rows(warehouse: Warehouse, experiment_id: str, since: datetime, node_names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The Ray workers that played shards of an experiment since ``since``.

    Each row: node (address and short id), worker (host:pid), engine, shards done,
    agents, agents/s while busy.
    """
    names = node_names or {}
    return [
        {
            "node": f"{names[w.node]} ({w.node[:8]})" if w.node in names else w.node[:12],
            "worker": w.worker,
            "engine": w.engine,
            "shards": w.shards,
            "agents": w.agents,
            "agents/s": round(w.agents_per_s, 1) if w.agents_per_s is not None else None,
        }
        for w in store.workers(warehouse, experiment_id, since)
    ]


def ray_node_names() -> dict[str, str]:
    """Ray node id → its address, for the nodes this driver can see (empty without Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return {}
        return {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    except Exception:
        return {}


class LiveTable:
    """A table artifact of one flow run: created at its first ``publish``, then updated in place
    (no new version, so the run's Artifacts tab shows one card). The flow makes one per run.

    Args:
        key: the artifact's key.
        description: shown under the table.
    """

    def __init__(self, key: str, description: str):
        self.key, self.description = key, description
        self.artifact_id: UUID | None = None

    def publish(self, rows: list[dict[str, Any]]) -> None:
        if self.artifact_id is None:
            self.artifact_id = safely(
                "create a table artifact", lambda: create_table_artifact(table=rows, key=self.key, description=self.description)
            )
            return
        artifact_id, update = self.artifact_id, ArtifactUpdate(data=table_artifact_data(rows), description=self.description)

        def send() -> None:
            with get_client(sync_client=True) as client:
                client.update_artifact(artifact_id, update)

        safely("update a table artifact", send)


def workers_table(experiment_id: str) -> LiveTable:
    """The table of the Ray workers a run of the experiment uses (``publish_workers``)."""
    return LiveTable(artifact_key("workers", experiment_id), f"{experiment_id}: Ray workers of this run (shards done, agents/s while busy)")


def publish_workers(warehouse: Warehouse, experiment_id: str, since: datetime, table: LiveTable) -> list[dict[str, Any]]:
    """The Ray workers in use since ``since``, published to ``table`` after each round."""
    rows = safely("read the shards table", lambda: worker_rows(warehouse, experiment_id, since, ray_node_names())) or []
    if rows:
        table.publish(rows)
    return rows


# ------------------------------------------------------------------------------ links
def publish_dashboard(url: str) -> str:
    """A link artifact to the Ray dashboard; returns the full URL."""
    link = url if "://" in url else f"http://{url}"
    safely(
        "create the dashboard link",
        lambda: create_link_artifact(link=link, link_text="Ray dashboard", key="ray-dashboard",
                                     description="Live view of the Ray cluster: nodes, actors, logs"),
    )
    return link


def publish_report(experiment_id: str) -> str | None:
    """The link to the experiment's live page on the report server ``keynes serve`` started
    (None without one: the report stage then links the written file).

    Published as the run starts, so the page can be watched while rounds land; its key is the
    report stage's, so a run never shows two report links.
    """
    base = report_base_url()
    if not base:
        return None
    link = page_url(base, experiment_id)
    safely(
        "create the report link",
        lambda: create_link_artifact(link=link, link_text=f"Live report: {experiment_id}", key=f"{artifact_key(experiment_id)}-report",
                                     description=f"{experiment_id}: live report page (it updates as rounds land)"),
    )
    return link
