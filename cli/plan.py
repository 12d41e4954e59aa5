"""``keynes plan``: an experiment's calls, tokens, time and cost before anything runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import console, fail, out
from cli.table import narrow_table


def plan(
    config: Annotated[Path, typer.Argument(help="The experiment config (YAML).")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: dotted.key=value (repeatable).")] = None,
    models: Annotated[Optional[str], typer.Option("--models", help="A models profile: laptop (the bundled models, a size a laptop finishes in minutes), served (a vLLM server: $KEYNES_SERVED_URL, $KEYNES_SERVED_MODEL), hosted (an OpenAI-compatible API: $OPENAI_API_KEY; docs/real-models.md) or a profile file; its engines replace the config's LLM engines and backstory engine, before --set (docs/paper.md).")] = None,
    sample_: Annotated[int, typer.Option("--sample", min=1, help="Agents whose prompts are rendered and counted.")] = 24,
    calibrate: Annotated[int, typer.Option("--calibrate", min=0, help="Agents that play round 1 on the configured engine to time it (0: none; openai engines send real requests).")] = 3,
    calls_per_second: Annotated[Optional[float], typer.Option("--calls-per-second", min=0, help="Your own throughput figure (LLM calls per second for the whole run) instead of the calibration's.")] = None,
    format_: Annotated[str, typer.Option("--format", help="Output format: table or json.")] = "table",
) -> None:
    """Estimate an experiment before running it: calls, tokens, time and cost per arm. Writes nothing.

    Example: keynes plan experiments/quickstart.yaml --set population.size=1000

    Example: keynes plan experiments/paper/temperature.yaml --models served --calibrate 0 --set population.size=1000000
    """
    from design.config import ConfigError
    from design.loading import load_config, run_overrides

    if format_ not in ("table", "json"):
        fail(f"--format: {format_!r} is not one of table, json")
    try:
        cfg = load_config(config, run_overrides(set_, models=models))
    except ConfigError as exc:
        fail(str(exc))
    from cli.runtime import starts
    from design.plan import plan as make_plan
    from tasks.actor import ShardPlayer

    with ScratchCommits() as committer:
        plans = make_plan(cfg, ShardPlayer, sample_, calibrate, calls_per_second, say=lambda text: console.print(text, highlight=False),
                          committer=committer)
    rows = [p.row() for p in plans]
    start_s, way = recorded_start(cfg)
    for i, r in enumerate(rows):  # the run's start comes once, before its first arm
        r["start_seconds"] = None if i or start_s is None else round(start_s, 1)
    if format_ == "json":
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    # Narrow enough for an 80-column terminal: two-line headings, a cost column only where an
    # engine has prices, and each arm's basis below the table.
    priced = any(r["cost"] is not None for r in rows)
    table = narrow_table(show_header=True, header_style="bold",
                         title=f"{cfg.name} ({cfg.experiment_id}): {cfg.population.size:,} agents, nothing run yet")
    for column in ("arm", "engine", "model", "prompt", "calls", "prompt\ntokens", "completion\ntokens", "time", "cost")[:9 if priced else 8]:
        table.add_column(column, justify="left" if column in ("arm", "engine", "model", "prompt") else "right",
                         overflow="fold" if column == "model" else "ellipsis")  # a long model name wraps, whole

    def num(value) -> str:
        return "–" if value is None else f"{value:,}"

    def duration(seconds) -> str:
        if seconds is None:
            return "–"
        minutes, rest = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        return f"{int(hours)} h {int(minutes)} min" if hours else f"{int(minutes)} min {rest:.0f} s" if minutes else f"{rest:.1f} s"

    def money(value) -> list[str]:
        return ["–" if value is None else f"{value:,.4f}"] if priced else []

    for r in rows:
        table.add_row(str(r["arm"]), r["engine"], r["model"], r["prompt_mode"], num(r["calls"]), num(r["prompt_tokens"]),
                      num(r["completion_tokens"]), duration(r["seconds"]), *money(r["cost"]))
    total = lambda key: None if any(r[key] is None for r in rows) else sum(r[key] for r in rows)  # noqa: E731
    if start_s is not None:
        table.add_row("start", "", "", "", "", "", "", duration(start_s), *money(None))
    if len(rows) > 1 or start_s is not None:
        seconds = total("seconds")
        table.add_row("all", "", "", "", num(total("calls")), num(total("prompt_tokens")), num(total("completion_tokens")),
                      duration(None if seconds is None else seconds + (start_s or 0.0)), *money(total("cost")), style="bold")
    out.print(table)
    for r in rows:
        out.print(f"arm {r['arm']}: {r['basis']}", highlight=False)
    if start_s is not None:
        out.print(f"start: Ray, Prefect's API, the models and the run's bookkeeping, as the last {way} run of "
                  f"{starts.engine_label(cfg)} here took", highlight=False)
    else:
        out.print(f"start: not in the time (no {way} run of {starts.engine_label(cfg)} here yet: keynes run records it)", highlight=False)
    if len(rows) > 1:
        out.print("all: the arms run one after another", highlight=False)
    for r in rows:
        if r["requests"]:
            out.print(request_table(r, priced, num, money))


def request_table(row: dict, priced: bool, num, money):
    """An HTTP engine's requests, prompt and completion tokens (and cost) of each round and phase,
    one request per agent and per distinct prompt (``design.plan.request_rows``); ≤: at most."""
    from design.plan import PER_AGENT, PER_PROMPT, request_totals

    table = narrow_table(show_header=True, header_style="bold", title=f"arm {row['arm']}: requests per agent and per prompt")
    for column in ("round", "phase", "way", "requests", "prompt\ntokens", "completion\ntokens", "cost")[:7 if priced else 6]:
        table.add_column(column, justify="left" if column in ("round", "phase", "way") else "right")
    for r in row["requests"]:
        table.add_row(str(r["round"]), r["phase"], r["way"], ("≤" if r["at_most"] else "") + num(r["requests"]),
                      num(r["prompt_tokens"]), num(r["completion_tokens"]), *money(r["cost"]))
    for way in (PER_AGENT, PER_PROMPT):
        mine = [r for r in row["requests"] if r["way"] == way]
        prompt, completion, cost = request_totals(row["requests"], way)
        table.add_row("all", "", way, ("≤" if any(r["at_most"] for r in mine) else "") + num(sum(r["requests"] for r in mine)),
                      num(int(prompt)), num(int(completion)), *money(cost), style="bold")
    return table


def recorded_start(cfg) -> tuple[float | None, str]:
    """The start the last run like this one took here (``cli/runtime/starts.py``), and how it starts."""
    from cli.runtime import stack, starts

    way = starts.way(cfg.workers.ray_address, stack.for_command(cfg.workers.ray_address)[0])
    return starts.recorded(way, starts.engine_label(cfg)), way


class ScratchCommits:
    """Commits calibration shards to a warehouse in a temporary folder, as the play stage commits
    shards (``tasks.store.commit_shards``), and times them: what every shard of a run costs the
    driver (``design.plan.Committer``). The folder is removed on exit; the run's own warehouse is
    never opened."""

    def __enter__(self) -> "ScratchCommits":
        import tempfile

        self.folder = tempfile.TemporaryDirectory(prefix="keynes-plan-")
        self.warehouse = None
        return self

    def __exit__(self, *exc) -> None:
        self.folder.cleanup()

    def __call__(self, arm, round_: int, shard: int, agents, result) -> float:
        import time
        from dataclasses import replace

        import polars as pl

        from tasks.actor import ShardJob
        from tasks.store import commit_shards, open_warehouse

        if self.warehouse is None:
            self.warehouse = open_warehouse(Path(self.folder.name) / "scratch.duckdb")
        # New agent ids for each shard number: every commit writes its rows, as a run's shards do.
        offset = (shard + 1) * (int(agents["agent_id"].max()) + 1)
        job = ShardJob(arm, 0, round_, shard, agents.with_columns(pl.col("agent_id") + offset))
        distributions = None if result.distributions is None else result.distributions.with_columns(shard=pl.lit(shard, pl.Int32))
        played = replace(result, guesses=result.guesses.with_columns(pl.col("agent_id") + offset, shard=pl.lit(shard)),
                         distributions=distributions)
        start = time.perf_counter()
        commit_shards(self.warehouse, [(job, played)])
        return time.perf_counter() - start
