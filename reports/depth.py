"""The report's reasoning sections: level-k shares and τ, paired comparisons, and "Read the agents".

Views and sections over ``ReportData`` frames read from the views ``reasoning_depth``,
``cognitive_hierarchy_fit``, ``human_reference``, ``paired_comparisons``,
``reasoning_highlights`` and ``reasoning_texts``; nothing is computed here.
"""

from __future__ import annotations

import html
import math

import numpy as np
import panel as pn
import polars as pl
from bokeh.models import ColumnDataSource, Whisker
from bokeh.palettes import Viridis256

from reports.data import ReportData
from reports.figures import ARM_COLORS, HUMAN_COLOR, ByAttribute, CompareByRound, _figure, _fit_legend, fmt, grid, markdown, plain, table

#: Colours of the classes that are not steps.
CLASS_COLORS = {"above step 0": "#b0b0b0", "equilibrium": "#222222", "beyond equilibrium": "#8c564b"}
#: How many values an attribute may have and still get its own τ figure.
MAX_VALUES_PLOTTED = 12
#: Level-k classes listed per legend column (more classes: more columns, not a taller figure).
CLASSES_PER_COLUMN = 6
#: Reasoning texts longer than this are cut on the static page (the served table has them whole).
MAX_TEXT = 1200
PICKS = ("lowest", "median", "highest", "winner")
CARD_CSS = """
.agent { border-left: 4px solid #4c72b0; padding: 4px 10px; margin: 6px 0; background: #f7f9fc; }
.agent .head { font-weight: 600; font-size: 13px; }
.agent .persona { color: #555; font-size: 12px; }
.agent .text { white-space: pre-wrap; font-size: 13px; margin-top: 3px; }
"""


def _class_color(name: str, steps: int) -> str:
    if name in CLASS_COLORS:
        return CLASS_COLORS[name]
    k = int(name.split()[1])
    return Viridis256[min(255, int(40 + 200 * k / max(steps, 1)))]


class DepthShares(pn.viewable.Viewer):
    """Level-k class shares of one round, one stacked bar per arm (Nagel's first-round analysis)."""

    def __init__(self, depth: pl.DataFrame, round_: int, labels: dict[int, str]):
        super().__init__()
        self.depth, self.round, self.labels = depth, round_, labels

    def __panel__(self) -> pn.viewable.Viewable:
        d = self.depth.filter(pl.col("attribute").is_null() & (pl.col("round") == self.round))
        classes = d.select("class", "class_rank").unique().sort("class_rank")["class"].to_list()
        arms = sorted(d["arm"].unique().to_list())
        names = [self.labels[a] for a in arms]
        data = {"arm": names}
        for c in classes:
            share = dict(zip(*d.filter(pl.col("class") == c).select("arm", "share")))
            data[c] = [100 * share.get(a, 0.0) for a in arms]
        steps = max([int(c.split()[1]) for c in classes if c.startswith("step")], default=1)
        p = _figure(f"Level-k classes of round {self.round}'s guesses (share of valid guesses)", legend=True,
                    height=max(170, 70 + 36 * len(arms)), y_range=list(reversed(names)), x_range=(0, 100))
        if classes:
            p.hbar_stack(classes, y="arm", height=0.6, source=ColumnDataSource(data),
                         color=[_class_color(c, steps) for c in classes], legend_label=classes)
        p.xaxis.axis_label = "% of valid guesses"
        return pn.pane.Bokeh(_fit_legend(p, columns=max(1, math.ceil(len(classes) / CLASSES_PER_COLUMN))), sizing_mode="stretch_width")


class TauByArm(pn.viewable.Viewer):
    """τ of each arm in one round with its bootstrap 95 % interval, beside the human pools
    (their published τ and 90 % interval) that played the same game."""

    def __init__(self, tau: pl.DataFrame, humans: pl.DataFrame, round_: int, labels: dict[int, str]):
        super().__init__()
        self.tau, self.humans, self.round, self.labels = tau, humans, round_, labels

    def __panel__(self) -> pn.viewable.Viewable:
        t = self.tau.filter(pl.col("attribute").is_null() & (pl.col("round") == self.round)).sort("arm")
        humans = self.humans.unique(["pool", "source"], maintain_order=True).sort("tau")
        rows = [self.labels[a] for a in t["arm"].to_list()] + [f"humans: {p}" for p in humans["pool"].to_list()]
        p = _figure(f"Cognitive-hierarchy τ, round {self.round} (95 % interval; humans 90 %)",
                    legend=True, height=max(190, 70 + 24 * len(rows)), y_range=list(reversed(rows)))
        fitted = t.filter(pl.col("tau").is_not_null())
        arm_rows = [self.labels[a] for a in fitted["arm"].to_list()]
        source = ColumnDataSource({"y": arm_rows, "tau": fitted["tau"].to_numpy(),
                                   "low": fitted["tau_low"].fill_null(fitted["tau"]).to_numpy(),
                                   "high": fitted["tau_high"].fill_null(fitted["tau"]).to_numpy(),
                                   "color": [ARM_COLORS[a % len(ARM_COLORS)] for a in fitted["arm"]]})
        p.scatter("tau", "y", source=source, size=10, color="color", legend_label="arm τ")
        p.add_layout(Whisker(source=source, base="y", lower="low", upper="high", dimension="width", line_color="#333"))
        if humans.height:
            hs = ColumnDataSource({"y": [f"humans: {x}" for x in humans["pool"]], "tau": humans["tau"].to_numpy(),
                                   "low": humans["tau_low"].to_numpy(), "high": humans["tau_high"].to_numpy()})
            p.scatter("tau", "y", source=hs, size=9, marker="diamond", color=HUMAN_COLOR,
                      legend_label="human pools (Camerer, Ho & Chong 2004)")
            p.add_layout(Whisker(source=hs, base="y", lower="low", upper="high", dimension="width", line_color=HUMAN_COLOR))
        ends = np.concatenate([source.data["high"], humans["tau_high"].to_numpy() if humans.height else []])
        p.x_range.start, p.x_range.end = 0, float(max(ends.max(initial=1.0), 1.0)) * 1.1
        p.xaxis.axis_label = "τ (mean number of thinking steps)"
        return pn.pane.Bokeh(_fit_legend(p), sizing_mode="stretch_width")


def reasoning_depth(data: ReportData) -> list[pn.viewable.Viewable]:
    """Level-k shares per arm, τ per arm beside the human pools, and τ by demographic group."""
    items: list[pn.viewable.Viewable] = [
        markdown("## Reasoning depth"),
        markdown("Each valid guess is classed by the step of iterated best response it lies nearest to "
            "(step 0 = the middle of the range, step k + 1 = the best response to step k; class boundaries at the "
            "geometric means of neighbouring steps' distances to the equilibrium, after Nagel 1995). τ is the "
            "cognitive-hierarchy mean number of thinking steps whose population mean equals the arms' mean guess "
            "(Camerer, Ho & Chong 2004); 'no τ fits' means no such population produces that mean."),
    ]
    if data.depth.is_empty():
        return items + [markdown("No round has been played yet.")]
    labels = {a: data.arm_label(a) for a in data.arms["arm"].to_list()}
    rounds = sorted(data.depth["round"].unique().to_list())
    shown = sorted({rounds[0], rounds[-1]})
    # One per row: arm labels and these titles are long, and a legend of many classes is wide.
    items.append(grid([DepthShares(data.depth, r, labels) for r in shown], columns=1))
    tau = data.tau
    if tau.is_empty():
        return items + [markdown("τ fits: none stored yet (they are computed when a report is built).")]
    items.append(grid([TauByArm(tau, data.human_tau.filter(pl.col("arm").is_in(tau["arm"].unique().to_list())), r, labels)
                       for r in shown], columns=1))
    whole = tau.filter(pl.col("attribute").is_null()).with_columns(
        interval=pl.when(pl.col("tau_low").is_not_null()).then(
            pl.format("{} – {}", pl.col("tau_low").round(2), pl.col("tau_high").round(2))).otherwise(pl.lit("–")))
    items.append(table(whole, {"arm": "arm", "model": "model", "prompt_mode": "prompt mode", "round": "round", "n": "valid",
                               "mean": "mean guess", "tau": "τ", "interval": "95 % interval", "fit": "fit"}))
    humans = data.human_tau.unique(["pool", "source"], maintain_order=True)
    if humans.height:
        items.append(markdown("Human pools that played the same game (τ fitted to their first-round mean):\n\n" + "\n".join(
            f"- {r['pool']}: mean {fmt(r['mean'])}, τ = {fmt(r['tau'])} (90 % interval {fmt(r['tau_low'])}–"
            f"{fmt(r['tau_high'])}, n = {r['n']}) — {r['source']}" for r in humans.iter_rows(named=True))))
    groups = tau.filter(pl.col("attribute").is_not_null() & pl.col("tau").is_not_null())
    attributes = [a for a in groups["attribute"].unique(maintain_order=True).to_list()
                  if groups.filter(pl.col("attribute") == a)["value"].n_unique() <= MAX_VALUES_PLOTTED]
    if attributes:
        frame = groups.drop("mean").rename({"tau": "mean", "tau_low": "ci95_low", "tau_high": "ci95_high", "n": "n_valid"})
        items += [markdown(f"### τ by demographic group (round {rounds[0]})"),
                  grid([ByAttribute(frame, a, rounds[0], labels, what="τ", axis="τ") for a in attributes], columns=2)]
    return items


def exact_answers(data: ReportData) -> list[pn.viewable.Viewable]:
    """Arms whose answers came from exact distributions (shared-context inference): the expected
    answer of each persona group, computed from the distributions themselves (no sampling noise)."""
    exact = data.exact_by_attribute
    if exact.is_empty():
        return []
    labels = {a: data.arm_label(a) for a in data.arms["arm"].to_list()}
    round_ = min(exact["round"].to_list())
    frame = exact.with_columns(mean=pl.col("expected"), ci95_low=pl.col("expected"), ci95_high=pl.col("expected"),
                               n_valid=pl.col("agents"))
    attributes = [a for a in frame["attribute"].unique(maintain_order=True).to_list()
                  if frame.filter(pl.col("attribute") == a)["value"].n_unique() <= MAX_VALUES_PLOTTED]
    if not attributes:
        return []
    return [
        markdown(f"### Exact expected answer by persona group (round {round_})"),
        markdown("From the stored answer distributions of shared-context arms: the expected answer of an agent drawn at "
            "random from each group, without sampling noise (`exact_answers_by_attribute`)."),
        grid([ByAttribute(frame, a, round_, labels, what="Exact expected answer", axis="expected answer",
                          interval="exact") for a in attributes], columns=2),
    ]


def paired_comparisons(data: ReportData) -> list[pn.viewable.Viewable]:
    """Pairs of arms that differ in one factor: mean paired difference per round, interval, p-value."""
    pairs = data.paired
    items: list[pn.viewable.Viewable] = [markdown("## Paired comparisons")]
    if pairs.is_empty():
        reasons = "; ".join(data.paired_missing) or "no rounds stored yet"
        return items + [markdown("No two arms of this page differ in exactly one factor (prompt mode, model, temperature "
                            f"or game) with rounds played by both ({reasons}).")]
    pairs = pairs.with_columns(pair=pl.format("arm {} {} − arm {} {} ({})", pl.col("arm_a"), pl.col("level_a"),
                                              pl.col("arm_b"), pl.col("level_b"), pl.col("factor")))
    items += [
        markdown("The same agents (same personas and seeds) in two arms that differ in one factor: the mean of each agent's "
            "guess in arm a minus its guess in arm b, with a 95 % t interval, and the Wilcoxon signed-rank p-value "
            "(agents who answered the same in both arms are left out of the test)."),
        CompareByRound(pairs.drop("mean_a", "mean_b").rename({"mean_difference": "mean"}), "pair", "Paired difference a − b per round",
                       axis="mean difference a − b (95 % CI)"),
        table(pairs, {"pair": "pair", "round": "round", "n_pairs": "agents", "mean_a": "mean a", "mean_b": "mean b",
                      "mean_difference": "a − b", "ci95_low": "95 % low", "ci95_high": "95 % high",
                      "median_difference": "median a − b", "wilcoxon_p": "Wilcoxon p", "note": "note"}, digits=4),
    ]
    return items


def _card(row: dict) -> str:
    text = row["reasoning"] or ""
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + " …"
    return (f'<div class="agent"><div class="head">{html.escape(row["pick"])}: guess {fmt(row["guess"])} · agent '
            f'{row["agent_id"]}{" · won" if row["winner"] else ""}</div>'
            f'<div class="persona">{html.escape(row["persona"] or "no persona attributes")}</div>'
            f'<div class="text">{html.escape(text)}</div></div>')


def read_the_agents(data: ReportData, served: bool = False) -> list[pn.viewable.Viewable]:
    """Per arm with reasoning and per round: the texts of the lowest, median, highest guesses and
    of winners; when served, a searchable, filterable table of every reasoning text."""
    highlights = data.highlights
    items: list[pn.viewable.Viewable] = [markdown("## Read the agents")]
    if highlights.is_empty():
        return items + [markdown("No arm on this page stored reasoning texts (chain-of-thought prompt modes do).")]
    if (data.arms.filter(pl.col("arm").is_in(highlights["arm"].unique().to_list()))["engine"] == "simulated").any():
        items.append(markdown("*Texts of arms on the simulated engine are labelled stand-ins, not a model's words.*"))
    order = {p: i for i, p in enumerate(PICKS)}
    for (arm,), by_arm in highlights.group_by("arm", maintain_order=True):
        items.append(markdown(f"### {plain(data.arm_label(arm))}"))
        for (round_,), rows in by_arm.group_by("round", maintain_order=True):
            rows = rows.with_columns(order=pl.col("pick").replace_strict(order, return_dtype=pl.Int32)).sort("order", "agent_id")
            cards = "".join(_card(r) for r in rows.iter_rows(named=True))
            items.append(pn.pane.HTML(f"<h4>Round {round_}</h4>{cards}", sizing_mode="stretch_width", stylesheets=[CARD_CSS]))
    if served:
        items += _searchable(data)
    return items


def _searchable(data: ReportData) -> list[pn.viewable.Viewable]:
    """Every reasoning text in a Tabulator: header filters per column and a guess-range slider."""
    texts = data.reasoning_texts().select("arm", "round", "agent_id", "guess", "winner", "persona", "reasoning")
    if texts.is_empty():
        return []
    frame = texts.to_pandas()
    guesses = texts["guess"].drop_nulls()
    low, high = (float(guesses.min()), float(guesses.max())) if guesses.len() else (0.0, 1.0)
    if low == high:
        high = low + 1
    widget = pn.widgets.Tabulator(
        frame, pagination="remote", page_size=20, show_index=False, sizing_mode="stretch_width", layout="fit_data_fill",
        header_filters={"arm": {"type": "number"}, "round": {"type": "number"}, "agent_id": {"type": "number"},
                        "guess": {"type": "number", "func": ">="}, "persona": {"type": "input", "func": "like"},
                        "reasoning": {"type": "input", "func": "like"}, "winner": {"type": "tickCross"}},
        formatters={"reasoning": {"type": "textarea"}}, disabled=True, name="reasoning texts")
    slider = pn.widgets.RangeSlider(name="guess range", start=low, end=high, value=(low, high), step=0.01)
    widget.add_filter(slider, "guess")
    return [markdown("### Every reasoning text\nFilter by typing in a column's header (persona and reasoning match any "
                "part of the text); the slider keeps guesses in a range."), slider, widget]
