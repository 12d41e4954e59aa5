"""The ``keynes`` app: every command registered on one typer app, and the entry point.

Each command lives in its own module (``cli.run``, ``cli.sql``, ...); the app's callback gives
Prefect and Ray keynes's settings before any command imports them (``cli.common.start``).
"""

from __future__ import annotations

import gc

import typer

from cli import bench, down, export, models, personas, plan, reference, report, run, serve, show, sql, up
from cli.common import main_options
from tasks.timings import mark

app = typer.Typer(add_completion=False, no_args_is_help=True, help="keynes: very large p-beauty-contest simulations with LLM agents.")
app.callback()(main_options)
app.command()(run.run)
app.command()(plan.plan)
app.command()(serve.serve)
app.command("up")(up.up)
app.command("down")(down.down)
app.command()(sql.sql)
app.command()(personas.personas)
app.command()(report.report)
app.command()(show.show)
app.command("export")(export.export_tables)
app.command("config")(reference.config_reference)

models_app = typer.Typer(no_args_is_help=True, help="Bundled models: list them, make them loadable by an engine.")
models_app.command("list")(models.models_list)
models_app.command("prepare")(models.models_prepare)
models_app.command("path")(models.models_path)
app.add_typer(models_app, name="models")

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print comparable figures (benchmarks/ in the source tree).")
bench_app.command("scale", add_help_option=False, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(bench.bench_scale)
app.add_typer(bench_app, name="bench")


def main() -> None:
    """The command in this process (``keynes``, cli/launch.py, first offers ``keynes run`` to the
    warm stack's runner)."""
    mark("cli: imported")
    try:
        app()
    finally:
        # Python's last collection at exit walks every object the command made, to free what
        # the process is about to give back anyway: 1.5 s after a 20,000-agent run here. What
        # must be closed (the warehouse, Ray, Prefect's temporary API, log handlers) is closed
        # by then or by atexit handlers, which still run.
        gc.freeze()


if __name__ == "__main__":
    main()
