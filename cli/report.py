"""``keynes report``: the report page, as one offline HTML file or a live report server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import console, fail, out, port_taken, report_login


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
