"""The report server: every experiment of one or more warehouses as live Panel pages.

``/`` lists the experiments (status, agents, arms, rounds, last update); ``/experiment?id=ID``
is one experiment's page. Each open page checks its warehouse every few seconds and redraws
itself when a round, shard or status landed, so a running experiment needs no reload. A server
shared beyond this machine asks for a login first (reports/login.py).
"""

from __future__ import annotations

import html
import logging
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import panel as pn
import polars as pl

from reports.app import HEADER_COLOR, build_page
from reports.data import ReportData, experiment_index, experiment_version
from reports.figures import markdown, plain
from reports.urls import public_url
from warehouse.store import Warehouse, WarehouseError

#: Seconds between two checks of an open page's warehouse.
REFRESH_S = 2.0
#: How long a page's check may wait for a writer that holds the file (it tries again later).
CHECK_LOCK_TIMEOUT_S = 1.0
#: Hosts that mean "this machine only".
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INDEX_CSS = """
table { border-collapse: collapse; font-size: 14px; width: 100%; }
th { background: #eef2f7; padding: 6px 10px; text-align: left; white-space: nowrap; }
td { padding: 5px 10px; border-top: 1px solid #e3e7ee; }
td.n { text-align: right; }
"""


class Catalog:
    """The warehouses a server shows, and where each experiment lives."""

    def __init__(self, dbs: list[str | Path]):
        seen: dict[Path, Warehouse] = {}
        for db in dbs:
            path = Path(db).resolve()
            seen.setdefault(path, Warehouse(path))
        self.warehouses = list(seen.values())

    def index(self) -> pl.DataFrame:
        """One row per experiment of every warehouse that exists yet, newest update first."""
        frames = []
        for warehouse in self.warehouses:
            if not warehouse.path.exists():
                continue
            try:
                frame = experiment_index(warehouse)
            except WarehouseError:
                continue  # held by a writer for longer than the lock timeout: shown next time
            frames.append(frame.with_columns(db=pl.lit(str(warehouse.path))))
        if not frames:
            return pl.DataFrame()
        return pl.concat(frames, how="diagonal_relaxed").sort("updated_at", descending=True, nulls_last=True)

    def find(self, experiment_id: str) -> Warehouse | None:
        """The warehouse that holds an experiment (None: none of them)."""
        for warehouse in self.warehouses:
            if warehouse.path.exists():
                try:
                    if experiment_version(warehouse, experiment_id) is not None:
                        return warehouse
                except WarehouseError:
                    continue
        return None


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def index_html(index: pl.DataFrame) -> str:
    """The index table: one linked row per experiment."""
    if index.is_empty():
        return "<p>No experiment yet: the warehouses are empty (or not created yet). This page updates by itself.</p>"
    head = ["experiment", "name", "status", "agents", "arms", "rounds played", "guesses", "last update", "warehouse"]
    rows = []
    for r in index.iter_rows(named=True):
        link = f'<a href="experiment?id={quote(r["experiment_id"])}">{html.escape(r["experiment_id"])}</a>'
        cells = [link, _cell(r["name"]), _cell(r["status"]), _cell(r["population"]), _cell(r["arms"]),
                 f"{r['rounds_played']:,} / {r['rounds_planned']:,}", _cell(r["guesses"]), _cell(r["updated_at"]),
                 _cell(Path(r["db"]).name)]
        rows.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in (3, 4, 5, 6) else f"<td>{c}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(rows) + "</tbody></table>")


def _template(title: str) -> pn.template.BootstrapTemplate:
    return pn.template.BootstrapTemplate(title=title, header_background=HEADER_COLOR, sidebar_width=230)


def _as_on_load():
    """The context in which a live page makes the panes it redraws, so they look as on a fresh load.

    A page is redrawn with new panes put into its layouts, never by changing a shown pane's
    text: Panel restyles such a pane, and one made while the page's callback runs, with its
    template's stylesheets for a pane standing alone (Bootstrap's own heading sizes and code
    colour over the template's). Panes made with no design are styled by the template, as on load.
    """
    return pn.config.set(design=None)


def index_page(catalog: Catalog, refresh_s: float = REFRESH_S) -> pn.template.BaseTemplate:
    """The ``/`` page: every experiment of the served warehouses, kept current."""
    page = _template("keynes reports")
    def table(text: str) -> pn.pane.HTML:
        return pn.pane.HTML(text, sizing_mode="stretch_width", stylesheets=[INDEX_CSS])

    shown = {"text": index_html(catalog.index())}
    holder = pn.Column(table(shown["text"]), sizing_mode="stretch_width")
    names = plain(", ".join(w.path.name for w in catalog.warehouses))
    page.main.append(pn.Column(markdown(f"## Experiments\nWarehouses: {names}"), holder, sizing_mode="stretch_width"))

    def refresh() -> None:
        text = index_html(catalog.index())
        if text != shown["text"]:
            shown["text"] = text
            with _as_on_load():
                holder.objects = [table(text)]

    pn.state.add_periodic_callback(refresh, period=int(refresh_s * 1000))
    return page


def experiment_page(catalog: Catalog, experiment_id: str | list[str] | None, refresh_s: float = REFRESH_S) -> pn.template.BaseTemplate:
    """An experiment's page (or one page comparing several experiments of one warehouse, for a
    list of ids); it redraws itself whenever one of them changed in its warehouse."""
    ids = [experiment_id] if isinstance(experiment_id, str) else list(experiment_id or [])
    warehouses = [catalog.find(e) for e in ids]
    if not ids or any(w is None for w in warehouses) or len({w.path for w in warehouses}) > 1:
        page = _template("keynes report")
        known = ", ".join(catalog.index().get_column("experiment_id").to_list()) if not catalog.index().is_empty() else "none"
        missing = [e for e, w in zip(ids, warehouses) if w is None] or ids
        problem = "are not in one warehouse" if ids and all(warehouses) else "is not in the served warehouses"
        page.main.append(pn.pane.Alert(
            f"Experiment {html.escape(', '.join(missing) or 'None')!s} {problem}; available: {known}. "
            '<a href="./">All experiments</a>', alert_type="warning"))
        return page
    warehouse = warehouses[0]
    subject = ids[0] if len(ids) == 1 else ids
    page = build_page(ReportData(warehouse, subject), served=True)
    # What a refresh redraws, each replaced whole (see _as_on_load): the experiment's facts in the
    # sidebar, the time of the last check, and the page's main column.
    facts = pn.Column(*page.sidebar.objects, sizing_mode="stretch_width")
    checked = pn.Column(sizing_mode="stretch_width")
    page.sidebar[:] = [facts, checked, markdown('[All experiments](./)')]
    # A short lock timeout: a page must not stall the server while a writer commits.
    probe = Warehouse(warehouse.path, lock_timeout_s=CHECK_LOCK_TIMEOUT_S)
    state = {"version": [experiment_version(warehouse, e) for e in ids]}

    def refresh() -> None:
        try:
            version = [experiment_version(probe, e) for e in ids]
        except WarehouseError:
            return  # a writer holds the file: look again at the next tick
        with _as_on_load():
            checked.objects = [markdown(f"*Live: checked {time.strftime('%H:%M:%S')}*")]
            if version == state["version"]:
                return
            state["version"] = version
            fresh = build_page(ReportData(warehouse, subject), served=True)
            page.main[0].objects = fresh.main[0].objects
            facts.objects = fresh.sidebar.objects

    pn.state.add_periodic_callback(refresh, period=int(refresh_s * 1000))
    return page


def websocket_origins(host: str, port: int) -> list[str]:
    """Origins allowed to open a page's websocket: the loopback names, or any when shared."""
    if host in LOOPBACK:
        return [f"127.0.0.1:{port}", f"localhost:{port}"]
    return ["*"]  # shared on a network (--host): any browser that can reach the port


class _ClosedTabs(logging.Filter):
    """Drops what a tab that closes while its page is being updated leaves in the log: asyncio's
    "Task exception was never retrieved" for tornado's WebSocketClosedError (a 12-line traceback)
    and Bokeh's and Panel's "Failed sending message as connection was closed". Closing a tab is
    not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tornado.websocket import WebSocketClosedError

        if record.exc_info and isinstance(record.exc_info[1], WebSocketClosedError):
            return False
        return record.getMessage() != "Failed sending message as connection was closed"


_CLOSED_TABS = _ClosedTabs()


def serve_reports(
    dbs: list[str | Path], host: str = "127.0.0.1", port: int = 5006, threaded: bool = False, refresh_s: float = REFRESH_S,
    login: str | dict[str, str] | None = None,
):
    """Serve the index and experiment pages of the warehouses ``dbs``.

    Args:
        dbs: warehouse files (they need not exist yet: their experiments appear when written).
        host: the address to bind; 127.0.0.1 keeps the pages on this machine.
        port: the port.
        threaded: return at once with the server running on a thread (``.stop()`` ends it);
            otherwise block until interrupted.
        refresh_s: seconds between two checks of an open page's warehouse.
        login: who may read the pages (reports/login.py's ``login_for``): a password, users and
            passwords, or None for no login. With one, every page and its websocket need Panel's
            basic-auth login (a form at ``/login``); its cookie is signed with a secret drawn for
            this server alone.
    """
    catalog = Catalog(dbs)
    for name in ("asyncio", "bokeh.server.views.ws", "panel.io.document"):
        logging.getLogger(name).addFilter(_CLOSED_TABS)

    def experiment() -> pn.template.BaseTemplate:
        # /experiment?id=A is one experiment's page; /experiment?id=A&id=B compares them.
        ids = [a.decode() for a in pn.state.session_args.get("id") or [] if a]
        return experiment_page(catalog, ids[0] if len(ids) == 1 else ids, refresh_s)

    routes = {"/": lambda: index_page(catalog, refresh_s), "/experiment": experiment}
    auth = {"basic_auth": login, "cookie_secret": secrets.token_urlsafe(32)} if login else {}
    return pn.serve(routes, address=host, port=port, show=False, threaded=threaded, title="keynes reports",
                    websocket_origin=websocket_origins(host, port), verbose=False, **auth)


def start_in_background(dbs: list[str | Path], host: str, port: int, login: str | dict[str, str] | None = None) -> str:
    """Start the report server on a daemon thread of this process (it ends with the process,
    never holding up its exit), with ``login`` as in ``serve_reports``; return its public base URL."""
    import asyncio
    import threading

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        serve_reports(dbs, host=host, port=port, login=login)

    threading.Thread(target=run, name="keynes-reports", daemon=True).start()
    return public_url(host, port)

