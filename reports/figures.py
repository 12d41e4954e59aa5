"""Plot: the report's views, each a Bokeh figure or a table that implements ``__panel__``.

Every figure is titled with what it compares; the target, the equilibrium and human
reference results are drawn as labelled lines. Views take frames from ``reports.data``.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

import numpy as np
import panel as pn
import polars as pl
import yaml
from bokeh.models import ColumnDataSource, Legend, Whisker
from bokeh.palettes import Category10_10
from bokeh.plotting import figure

ARM_COLORS = Category10_10
BAR_COLOR = "#4c72b0"
TARGET_COLOR = "#d62728"
EQUILIBRIUM_COLOR = "#222222"
MEAN_COLOR = "#1f77b4"
HUMAN_COLOR = "#2ca02c"
POOL_COLOR = "#8c8c8c"
FIGURE_HEIGHT = 270
MIN_WIDTH = 280
LEGEND_WIDTH = 210
#: A legend's height: LEGEND_BOX plus LEGEND_ROW per row of entries (9 pt labels, with its margins).
LEGEND_ROW, LEGEND_BOX = 23, 37
#: What a figure's height holds besides its frame: the title above, the x axis and its label below.
FIGURE_CHROME = 75
TOOLS = "pan,wheel_zoom,box_zoom,reset,save,hover"
TABLE_CSS = """
table { border-collapse: collapse; font-size: 13px; }
th { background: #eef2f7; padding: 4px 10px; text-align: right; white-space: nowrap; }
td { padding: 3px 10px; text-align: right; border-top: 1px solid #e3e7ee; }
"""


def fmt(value: Any, digits: int = 2) -> str:
    """Numbers as the report prints them (2 decimals; integers and text unchanged)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(frame: pl.DataFrame, columns: dict[str, str], digits: int = 2) -> pn.pane.DataFrame:
    """A static HTML table of ``frame``'s columns renamed by ``columns`` (name → header)."""
    shown = frame.select(list(columns)).rename(columns)
    text = {c: [fmt(v, digits) for v in shown[c].to_list()] for c in shown.columns}
    return pn.pane.DataFrame(pl.DataFrame(text).to_pandas(), index=False, escape=True, sizing_mode="stretch_width",
                             stylesheets=[TABLE_CSS])


def _figure(title: str, width: int | None = None, height: int = FIGURE_HEIGHT, legend: bool | str = False, **kwargs) -> figure:
    """A figure as wide as its place on the page (or ``width`` pixels); with ``legend`` its
    legend sits right of the plot (``legend="below"``: under it, for a figure in a narrow column),
    never over the data; ``_fit_legend`` then makes the figure tall enough for it."""
    # No toolbar drawn (it crowds titles and legends); hover, pan and wheel zoom still work.
    place = "right" if legend is True else legend
    beside = LEGEND_WIDTH if place == "right" else 0
    size = {"width": width + beside} if width else {"sizing_mode": "stretch_width", "min_width": MIN_WIDTH + beside}
    p = figure(title=title, height=height, tools=TOOLS, toolbar_location=None, **size, **kwargs)
    if place:
        # Added before any glyph, so every legend_label lands in this legend.
        p.add_layout(Legend(label_text_font_size="9pt", click_policy="hide", border_line_alpha=0, location="top_left"), place)
    p.title.text_font_size = "12pt"
    p.xgrid.grid_line_alpha = 0.3
    p.ygrid.grid_line_alpha = 0.3
    return p


def _fit_legend(p: figure, columns: int = 1, rows: int = 0) -> figure:
    """Make ``p`` tall enough to show its legend whole (laid out in ``columns``, room for at least
    ``rows``): a legend below the plot adds its height; one at the right needs a frame at least as
    tall as itself."""
    legend = p.legend[0]
    legend.ncols = columns
    needed = LEGEND_BOX + LEGEND_ROW * max(rows, math.ceil(len(legend.items) / columns))
    if legend in p.below:
        legend.margin = 0  # Bokeh centres it in the space added below the x axis
        p.height += needed
    else:
        p.height = max(p.height, FIGURE_CHROME + needed)
    return p


def grid(items: list, columns: int = 3) -> pn.GridBox:
    """Views side by side, as many per row as fit ``columns``, together as wide as the page."""
    return pn.GridBox(*items, ncols=max(1, min(columns, len(items))), sizing_mode="stretch_width")


def _fit_y(p: figure, low: np.ndarray, high: np.ndarray, floor: float | None = None) -> None:
    """Y range over every interval (whiskers do not take part in Bokeh's auto-range)."""
    lo, hi = float(np.nanmin(low)), float(np.nanmax(high))
    pad = max((hi - lo) * 0.08, 0.5)
    p.y_range.start = lo - pad if floor is None else max(floor, lo - pad)
    p.y_range.end = hi + pad


def _short(source: str) -> str:
    """"Nagel (1995), AER 85(5), p = 2/3" → "Nagel (1995)"."""
    return source.split(",")[0]


def _vline(p: figure, x: float, top: float, color: str, dash: str, label: str) -> None:
    p.segment(x0=[x], x1=[x], y0=[0], y1=[top], line_color=color, line_width=2.5, line_dash=dash, legend_label=label)


class RoundHistogram(pn.viewable.Viewer):
    """Histogram of one arm's guesses in one round, with the target, the equilibrium and
    (where the rule matches) a human reference mean marked — like the paper's figures."""

    def __init__(self, bins: pl.DataFrame, summary: dict[str, Any], rule: dict[str, Any], reference: pl.DataFrame, label: str):
        super().__init__()
        self.bins, self.summary, self.rule, self.reference, self.label = bins, summary, rule, reference, label

    def __panel__(self) -> pn.viewable.Viewable:
        s = self.summary
        # Rounds stand three in a row: the legend goes under each plot, where it has the column's width.
        p = _figure(f"Round {s['round']}: guesses (n = {s['n_valid']:,} valid)", legend="below",
                    x_range=(self.rule["low"], self.rule["high"]))
        top = float(self.bins["n"].max() or 1) * 1.08
        p.quad(left=self.bins["bin_low"].to_numpy(), right=self.bins["bin_high"].to_numpy(), bottom=0,
               top=self.bins["n"].to_numpy(), fill_color=BAR_COLOR, line_color="white", fill_alpha=0.85)
        if s["target"] is not None:
            _vline(p, s["target"], top, TARGET_COLOR, "solid", f"target {fmt(s['target'])}")
        if s["mean"] is not None:
            _vline(p, s["mean"], top, MEAN_COLOR, "dotted", f"mean {fmt(s['mean'])}")
        _vline(p, self.rule["equilibrium"], top, EQUILIBRIUM_COLOR, "dashed", f"equilibrium {fmt(self.rule['equilibrium'])}")
        for ref in self.reference.filter(pl.col("round") == s["round"]).iter_rows(named=True):
            _vline(p, ref["mean"], top, HUMAN_COLOR, "dashdot", f"humans, {_short(ref['source'])}: mean {fmt(ref['mean'])}")
        p.xaxis.axis_label = "guess"
        p.yaxis.axis_label = "agents"
        p.yaxis.ticker.min_interval = 1  # counts are whole agents
        p.y_range.start = 0
        # Target, mean, equilibrium and the most human lines of any round: the arm's plots stand level.
        rows = 3 + max(self.reference["round"].value_counts()["count"].to_list(), default=0)
        return pn.pane.Bokeh(_fit_legend(p, rows=rows), sizing_mode="stretch_width")


class Convergence(pn.viewable.Viewer):
    """One arm across rounds: mean, median, target and winning number against the equilibrium."""

    def __init__(self, rounds: pl.DataFrame, rule: dict[str, Any], reference: pl.DataFrame, label: str):
        super().__init__()
        self.rounds, self.rule, self.reference, self.label = rounds, rule, reference, label

    def __panel__(self) -> pn.viewable.Viewable:
        r = self.rounds
        p = _figure(f"Convergence across rounds: {self.label}", legend=True,
                    y_range=(self.rule["low"], self.rule["high"]))
        x = r["round"].to_numpy()
        for column, color, dash, label in [
            ("mean", MEAN_COLOR, "solid", "mean"),
            ("median", "#9467bd", "dotted", "median"),
            ("target", TARGET_COLOR, "solid", "target"),
            ("winning_guess", "#ff7f0e", "dashed", "winning number"),
        ]:
            y = r[column].to_numpy()
            p.line(x, y, line_color=color, line_width=2.5, line_dash=dash, legend_label=label)
            p.scatter(x, y, color=color, size=7, legend_label=label)
        # An arm whose first round is still being played has no rounds yet: draw the frame anyway.
        first, last = (x.min(), x.max()) if len(x) else (1, max(int(self.rule.get("rounds") or 1), 1))
        p.line([first - 0.2, last + 0.2], [self.rule["equilibrium"]] * 2, line_color=EQUILIBRIUM_COLOR,
               line_dash="dashed", line_width=2, legend_label=f"equilibrium {fmt(self.rule['equilibrium'])}")
        for ref in self.reference.iter_rows(named=True):
            p.scatter([ref["round"]], [ref["mean"]], marker="star", size=16, color=HUMAN_COLOR,
                      legend_label=f"humans, {_short(ref['source'])}: round {ref['round']} mean {fmt(ref['mean'])}")
        p.xaxis.ticker = list(x) if len(x) else list(range(int(first), int(last) + 1))
        p.xaxis.axis_label = "round"
        p.yaxis.axis_label = "guess"
        return pn.pane.Bokeh(_fit_legend(p), sizing_mode="stretch_width")


class CompareByRound(pn.viewable.Viewer):
    """Mean guess per round for each group (prompt mode, model or rule), with 95 % CIs."""

    def __init__(self, stats: pl.DataFrame, key: str, title: str, axis: str = "mean guess (95 % CI)"):
        super().__init__()
        self.stats, self.key, self.title, self.axis = stats, key, title, axis

    def __panel__(self) -> pn.viewable.Viewable:
        groups = self.stats[self.key].unique(maintain_order=True).to_list()
        rounds = sorted(self.stats["round"].unique().to_list())
        # An explicit x range: the dodged points and whiskers all stay inside the frame.
        p = _figure(self.title, legend=True, x_range=(min(rounds) - 0.5, max(rounds) + 0.5))
        width = 0.6 / max(len(groups), 1)
        for i, group in enumerate(groups):
            color = ARM_COLORS[i % len(ARM_COLORS)]
            g = self.stats.filter(pl.col(self.key) == group).sort("round")
            x = g["round"].to_numpy() + (i - (len(groups) - 1) / 2) * width
            source = ColumnDataSource({"x": x, "mean": g["mean"].to_numpy(), "low": g["ci95_low"].fill_null(g["mean"]).to_numpy(),
                                       "high": g["ci95_high"].fill_null(g["mean"]).to_numpy()})
            p.line("x", "mean", source=source, color=color, line_width=2, legend_label=str(group))
            p.scatter("x", "mean", source=source, color=color, size=8, legend_label=str(group))
            p.add_layout(Whisker(source=source, base="x", lower="low", upper="high", line_color=color))
        _fit_y(p, self.stats["ci95_low"].fill_null(self.stats["mean"]).to_numpy(),
               self.stats["ci95_high"].fill_null(self.stats["mean"]).to_numpy())
        p.xaxis.ticker = rounds
        p.xaxis.axis_label = "round"
        p.yaxis.axis_label = self.axis
        return pn.pane.Bokeh(_fit_legend(p), sizing_mode="stretch_width")


class ByAttribute(pn.viewable.Viewer):
    """Mean guess by the values of one demographic attribute, per arm, with 95 % CIs.

    Values run down the y axis, so every label reads whole and horizontally however long it is.
    """

    def __init__(self, stats: pl.DataFrame, attribute: str, round_: int, labels: dict[int, str], what: str = "Mean guess",
                 axis: str = "mean guess", interval: str = "95 % CI"):
        super().__init__()
        self.stats, self.attribute, self.round, self.labels, self.what, self.axis = stats, attribute, round_, labels, what, axis
        self.interval = interval

    def __panel__(self) -> pn.viewable.Viewable:
        s = self.stats.filter((pl.col("attribute") == self.attribute) & (pl.col("round") == self.round))
        values = sorted(s["value"].unique().to_list(), reverse=True)  # read top-down in order
        arms = sorted(s["arm"].unique().to_list())
        p = _figure(f"{self.what} by {self.attribute.replace('_', ' ')} (round {self.round}, {self.interval})", legend=True,
                    height=max(200, 70 + len(values) * (12 + 10 * len(arms))), y_range=(-0.5, len(values) - 0.5))
        width = 0.7 / max(len(arms), 1)
        position = {v: i for i, v in enumerate(values)}
        for j, arm in enumerate(arms):
            color = ARM_COLORS[arm % len(ARM_COLORS)]
            a = s.filter(pl.col("arm") == arm)
            y = np.array([position[v] for v in a["value"].to_list()], dtype=float) - (j - (len(arms) - 1) / 2) * width
            source = ColumnDataSource({"y": y, "mean": a["mean"].to_numpy(), "n": a["n_valid"].to_numpy(),
                                       "low": a["ci95_low"].fill_null(a["mean"]).to_numpy(),
                                       "high": a["ci95_high"].fill_null(a["mean"]).to_numpy()})
            p.scatter("mean", "y", source=source, color=color, size=9, legend_label=self.labels.get(arm, f"arm {arm}"))
            p.add_layout(Whisker(source=source, base="y", lower="low", upper="high", dimension="width", line_color=color))
        if s.height:
            lo = s["ci95_low"].fill_null(s["mean"]).to_numpy()
            hi = s["ci95_high"].fill_null(s["mean"]).to_numpy()
            pad = max((float(np.nanmax(hi)) - float(np.nanmin(lo))) * 0.08, 0.5)
            p.x_range.start, p.x_range.end = float(np.nanmin(lo)) - pad, float(np.nanmax(hi)) + pad
        p.yaxis.ticker = list(range(len(values)))
        p.yaxis.major_label_overrides = {i: v for i, v in enumerate(values)}
        p.xaxis.axis_label = self.axis
        return pn.pane.Bokeh(_fit_legend(p), sizing_mode="stretch_width")


class Composition(pn.viewable.Viewer):
    """The population's share of each value of one attribute."""

    def __init__(self, composition: pl.DataFrame, attribute: str):
        super().__init__()
        self.composition, self.attribute = composition, attribute

    def __panel__(self) -> pn.viewable.Viewable:
        c = self.composition.filter(pl.col("attribute") == self.attribute).sort("value", descending=True)
        values = c["value"].to_list()
        p = _figure(f"Population by {self.attribute.replace('_', ' ')}",
                    height=max(160, 40 + 26 * len(values)), y_range=values)
        p.hbar(y=values, right=(c["share"] * 100).to_numpy(), height=0.7, color=BAR_COLOR)
        p.xaxis.axis_label = "% of agents"
        p.x_range.start = 0
        return pn.pane.Bokeh(p, sizing_mode="stretch_width")


class BarsByArm(pn.viewable.Viewer):
    """One number per arm as bars (e.g. the invalid-answer rate), labelled by arm."""

    def __init__(self, frame: pl.DataFrame, column: str, title: str, axis: str, labels: dict[int, str], scale: float = 1.0):
        super().__init__()
        self.frame, self.column, self.title, self.axis, self.labels, self.scale = frame, column, title, axis, labels, scale

    def __panel__(self) -> pn.viewable.Viewable:
        names = [self.labels[a] for a in self.frame["arm"].to_list()]
        p = _figure(self.title, height=max(180, 60 + 34 * len(names)), y_range=list(reversed(names)))
        p.hbar(y=names, right=(self.frame[self.column].fill_null(0) * self.scale).to_numpy(), height=0.6,
               color=[ARM_COLORS[a % len(ARM_COLORS)] for a in self.frame["arm"].to_list()])
        p.xaxis.axis_label = self.axis
        p.x_range.start = 0
        return pn.pane.Bokeh(p, sizing_mode="stretch_width")


class PoolMeans(pn.viewable.Viewer):
    """Round-1 mean guess of the page's arms beside published LLM pools of the same game, one row
    each, lowest first; a pool of an arm's own model is drawn in that arm's colour, others in grey."""

    def __init__(self, pools: pl.DataFrame, title: str):
        super().__init__()
        self.pools, self.title = pools, title

    def __panel__(self) -> pn.viewable.Viewable:
        rows = self.pools.filter(pl.col("mean").is_not_null())
        players = rows["player"].to_list()
        p = _figure(self.title, legend=True, height=max(200, 70 + 24 * len(players)), y_range=list(reversed(players)))
        for kind, marker, label in (("arm", "circle", "arms of this page"), ("published", "diamond", "published LLM pools")):
            r = rows.filter(pl.col("kind") == kind)
            colors = [POOL_COLOR if a is None else ARM_COLORS[a % len(ARM_COLORS)] for a in r["arm"].to_list()]
            if r.height:
                p.scatter(r["mean"].to_numpy(), r["player"].to_list(), marker=marker, size=11, color=colors, legend_label=label)
        p.x_range.start, p.x_range.end = 0, 100
        p.xaxis.axis_label = "round-1 mean guess"
        return pn.pane.Bokeh(p, sizing_mode="stretch_width")


def plain(value: Any) -> str:
    """``value`` as Markdown shows it, character for character: a config's names and labels
    (models, prompt modes, experiments) are whatever their author wrote, and no ``<`` of theirs
    may become an element of the page."""
    return html.escape(str(value), quote=False)


def markdown(text: str, **kwargs) -> pn.pane.Markdown:
    """Markdown across the page's width (what a config or model wrote goes in through ``plain``)."""
    return pn.pane.Markdown(text, sizing_mode="stretch_width", **kwargs)


def config_block(config: Any) -> pn.pane.Markdown:
    """The experiment's stored config as YAML (the format it was written in), in a code block
    that no run of backticks in it can close."""
    return text_block(yaml.safe_dump(json.loads(config) if isinstance(config, str) else config, sort_keys=False, width=100), "yaml")


def text_block(text: str, language: str = "text") -> pn.pane.Markdown:
    """``text`` as it is, in a code block that no run of backticks in it can close."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
    return markdown(f"{fence}{language}\n{text.rstrip(chr(10))}\n{fence}")
