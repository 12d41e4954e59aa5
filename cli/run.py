"""``keynes run``: run (or resume) an experiment, with progress bars."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cli.common import START_A_SERVER, STARTUP_TIMEOUT, RichReporter, bold, call_flow, console, fail, warm_stack
from tasks.timings import mark


def run(
    config: Annotated[Path, typer.Argument(help="The experiment config (YAML).")],
    db: Annotated[Optional[Path], typer.Option("--db", help="The DuckDB warehouse (overrides `db` in the config).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: dotted.key=value (repeatable).")] = None,
    models: Annotated[Optional[str], typer.Option("--models", help="A models profile: laptop (the bundled models, a size a laptop finishes in minutes), served (a vLLM server: $KEYNES_SERVED_URL, $KEYNES_SERVED_MODEL), hosted (an OpenAI-compatible API: $OPENAI_API_KEY; docs/real-models.md) or a profile file; its engines replace the config's LLM engines and backstory engine, before --set (docs/paper.md).")] = None,
) -> None:
    """Run (or resume) an experiment and store every guess.

    Example: keynes run experiments/quickstart.yaml --set population.size=1000 --set game.rounds=2

    Example: keynes run experiments/paper/temperature.yaml --models laptop
    """
    import time

    began = time.monotonic()
    from design.config import ConfigError
    from design.loading import load_config, run_overrides
    from warehouse.store import Warehouse, WarehouseError

    overrides = run_overrides(set_, db, models)
    try:
        cfg = load_config(config, overrides)
        # Before anything starts: a run that cannot write its warehouse writes nothing.
        Warehouse(cfg.db).check_writable()
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    from cli.runtime.processes import guard

    for line in guard("keynes run"):  # what a killed earlier run left behind
        console.print(line, highlight=False)
    stack = warm_stack(cfg.workers.ray_address)  # `keynes up`'s Ray and Prefect API, if they run
    from design.prompting import check_prompting

    try:  # a rerun whose templates or models changed starts nothing (the flow's order: the change is named first)
        check_same_inputs(cfg)
        check_prompting(cfg, cfg.arms_list())  # nor a model that cannot be prompted as configured, nor a server that cannot answer
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    from tasks import progress as progress_hooks

    columns = [TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(), TextColumn("agents"), TimeElapsedColumn(), TimeRemainingColumn()]
    console.print(
        bold(cfg.name, f" ({cfg.experiment_id}): {cfg.population.size:,} agents × {cfg.game.rounds} round(s) × "
                       f"{len(cfg.arms_list())} arm(s) → {cfg.db}"), highlight=False,
    )
    mark("cli: header")
    # A caller's own Ray (keynes run called in-process) stays up.
    ray_was_up = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    from cli.runtime.stack import join_in_background

    joined = join_in_background(stack, lambda line: console.print(line, highlight=False)) if stack is not None else None
    from cli.runtime.temporary_api import TemporaryAPIError, kept_alive, start_in_background

    api_answers = start_in_background()  # Prefect's temporary API starts while Ray and the actors do
    from flows.experiment import experiment, warm_start
    from tasks.pool import shutdown_pools, stop_ray

    try:
        with kept_alive(lambda line: console.print(line, highlight=False)):
            if joined is not None:
                try:  # the warm stack's Ray (joined while Prefect and the flow imported), before warm_start would start one
                    joined()
                except Exception as exc:
                    fail(f"could not join the warm stack's Ray at {stack.ray_address} ({str(exc).strip()}); nothing was run. "
                         "Restart it (keynes down, keynes up) or run without it (KEYNES_WARM_STACK=off)")
            warm_start(cfg)  # Ray, and the actors that load their model meanwhile
            api_answers()
            with Progress(*columns, console=console, transient=False, disable=not console.is_terminal and os.environ.get("KEYNES_PROGRESS") != "1") as bar:
                with progress_hooks.reporting(RichReporter(bar)):
                    mark("cli: flow called")
                    summary = call_flow(experiment, str(config), overrides)
                    mark("cli: flow returned")
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    except TemporaryAPIError as exc:
        fail(f"{exc} ({STARTUP_TIMEOUT}); nothing was run. Give it longer, or {START_A_SERVER}" if exc.timed_out
             else f"{exc}; nothing was run. Try again, or {START_A_SERVER}")
    finally:
        if ray_was_up:
            shutdown_pools()  # the actors warm_start started in the caller's Ray (none left once the flow ran)
        else:
            stop_ray()
        mark("cli: ray shut down")
    if summary.message:  # nothing was played: say why (e.g. a `continue` experiment is complete)
        console.print(summary.message, highlight=False)
        return
    if summary.rounds_played:  # what starting took, for keynes plan (cli/runtime/starts.py)
        from cli.runtime import starts

        rounds_s = sum(arm.rounds_s for arm in summary.rounds.values())
        starts.record(starts.way(cfg.workers.ray_address, stack), starts.engine_label(cfg), time.monotonic() - began - rounds_s)
    # Soft-wrapped: the terminal folds a long line, so the command and the path copy whole.
    console.print(
        f"done: {summary.rounds_played} round(s) played, {summary.rows_written:,} guesses written. "
        f"Query them: keynes sql --db {shlex.quote(str(cfg.db))} \"select * from round_summary\"", highlight=False, soft_wrap=True,
    )
    if summary.report:
        console.print(f"report: {summary.report}", highlight=False, soft_wrap=True)


def check_same_inputs(cfg) -> None:
    """Refuse a rerun of an experiment whose templates, models or chat templates changed since
    its first run (``design.inputs``), reading the warehouse only.

    Raises:
        design.inputs.InputsChanged: one line naming the change and how to go on.
    """
    from design.inputs import check_inputs, fingerprint
    from warehouse.provenance import recorded_inputs
    from warehouse.store import Warehouse

    check_inputs(cfg.experiment_id, recorded_inputs(Warehouse(cfg.db), cfg.experiment_id, read_only=True), fingerprint(cfg))
