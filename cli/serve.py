"""``keynes serve``: deployments of the experiment flow with their schedules, and a report server beside them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import START_A_SERVER, bold, console, fail, log_level_chosen, port_taken, report_login


def serve(
    configs: Annotated[list[Path], typer.Argument(help="Experiment configs (YAML): one deployment each.")],
    db: Annotated[Optional[Path], typer.Option("--db", help="The DuckDB warehouse of every deployment (default: each config's `db`).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a config field in every deployment: dotted.key=value (repeatable).")] = None,
    models: Annotated[Optional[str], typer.Option("--models", help="A models profile for every deployment (laptop, served, hosted or a profile file; docs/paper.md).")] = None,
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
    if not log_level_chosen():  # flow-run logs belong in the UI
        os.environ["PREFECT_LOGGING_LEVEL"] = "INFO"
    login = report_login(report_host, report_credentials, report_public, "report-") if report_port else None
    from design.config import ConfigError
    from design.loading import load_config, run_overrides
    from warehouse.store import Warehouse, WarehouseError

    overrides = list(set_ or [])
    dbs: list[Path] = []
    try:
        for config in configs:
            dbs.append(Path(load_config(config, run_overrides(overrides, db, models)).db).resolve())
            Warehouse(dbs[-1]).check_writable()
        from cli.runtime.serving import serve as serve_deployments
        from flows.deploy import deployments_for, ping

        deployments = deployments_for(list(configs), overrides, db, models)
    except (ConfigError, WarehouseError) as exc:
        fail(str(exc))
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:
        fail(f"PREFECT_API_URL is not set: {START_A_SERVER}")
    problem = ping(api)
    if problem:
        fail(f"PREFECT_API_URL {api}: {problem}")
    from cli.runtime.processes import guard

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

    from cli.runtime.processes import release

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
