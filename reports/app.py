"""Layout: one page per experiment — overview, each arm, comparisons, answers and cost.

``build_page`` assembles the views of ``reports.figures`` from a ``ReportData`` into a
``pn.template``; ``reports.export`` saves it offline or serves it.
"""

from __future__ import annotations

from datetime import datetime, timezone

import panel as pn
import polars as pl

from reports.data import ReportData
from reports.depth import exact_answers, paired_comparisons, read_the_agents, reasoning_depth
from reports.figures import BarsByArm, ByAttribute, CompareByRound, Composition, Convergence, RoundHistogram, config_block, fmt, grid, markdown, plain, table, text_block
from reports.pools import arm_paper, arm_published, published_pools
from warehouse.provenance import session_lines

HEADER_COLOR = "#2b4a6f"
#: How many values an attribute may have and still get its own comparison figure.
MAX_VALUES_PLOTTED = 12

def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    minutes, seconds = divmod(value, 60)
    return f"{int(minutes)} min {seconds:.1f} s" if minutes else f"{seconds:.1f} s"


def overview(data: ReportData) -> list[pn.viewable.Viewable]:
    """Config, population size and composition, arms, run times and tokens."""
    o = data.overview
    usage = data.usage
    arms = data.arms.join(usage.select("arm", "prompt_tokens", "completion_tokens", "play_s"), on="arm", how="left")
    facts = (
        f"**Population** {o['population']:,} agents · **arms** {o['arms']} · **rounds played** {o['rounds_played']} · "
        f"**guesses** {o['guesses']:,} ({o['valid_guesses']:,} valid) · **tokens** {o['prompt_tokens']:,} prompt + "
        f"{o['completion_tokens']:,} completion · **run time** {_seconds(o['wall_s'])} · **status** {o['status']} · "
        f"**seed** {o['seed']} · **told of earlier rounds** {data.history[o['experiment_id']]}"
    )
    items: list[pn.viewable.Viewable] = [markdown("## Overview")]
    if data.comparing:
        items += [markdown(f"This page compares the arms of {len(data.experiment_ids)} experiments; arms are numbered across "
                      "them, each labelled with its experiment."),
                  table(data.experiments.with_columns(history=pl.col("experiment_id").replace_strict(data.history)),
                        {"name": "experiment", "experiment_id": "id", "population": "agents", "arms": "arms",
                         "rounds_played": "rounds played", "history": "told of earlier rounds", "guesses": "guesses",
                         "status": "status", "created_at": "started"})]
    else:
        items.append(markdown(facts))
    if (data.arms["engine"] == "simulated").any():
        items.append(pn.pane.Alert(
            "Arms on the **simulated** engine use no language model: their numbers come from a named decision rule "
            "(see the model column). They exist for scale tests and fast checks.", alert_type="warning"))
    items += [
        markdown("### Arms"),
        table(arms, {"arm": "arm", "engine": "engine", "model": "model", "prompt_mode": "prompt mode",
                     "temperature": "temperature", "rule": "rule", "rounds": "rounds", "status": "status",
                     "wall_s": "wall time (s)", "play_s": "play time (s)", "prompt_tokens": "prompt tokens",
                     "completion_tokens": "completion tokens"}),
    ]
    attributes = data.composition["attribute"].unique(maintain_order=True).to_list()
    if attributes and not data.comparing:  # several populations: their sizes are in the table above
        items += [markdown(f"### Population ({o['population']:,} agents)"),
                  grid([Composition(data.composition, a) for a in attributes])]
    return items


def arm_section(data: ReportData, arm: int) -> list[pn.viewable.Viewable]:
    """One arm: its round table, a histogram per round and its convergence."""
    rule = data.arms.filter(pl.col("arm") == arm).row(0, named=True)
    rounds = data.rounds.filter(pl.col("arm") == arm)
    reference = data.references.filter(pl.col("arm") == arm).drop("arm")
    label = data.arm_label(arm)
    histograms = [
        RoundHistogram(data.histogram.filter((pl.col("arm") == arm) & (pl.col("round") == r["round"])), r, rule, reference, label)
        for r in rounds.iter_rows(named=True)
    ]
    return [
        markdown(f"### {plain(label.capitalize())} · {plain(rule['rule'])} · {plain(rule['engine'])}"),
        table(rounds, {"round": "round", "n": "agents", "n_valid": "valid", "invalid_rate": "invalid rate",
                       "mean": "mean", "median": "median", "sd": "sd", "target": "target",
                       "winning_guess": "winning number", "n_winners": "winners",
                       "distance_to_equilibrium": "distance to equilibrium", "seconds": "seconds"}),
        *arm_published(data, arm),
        *arm_paper(data, arm),
        grid(histograms),
        Convergence(data.convergence.filter(pl.col("arm") == arm), rule, reference, label),
    ]


def comparisons(data: ReportData) -> list[pn.viewable.Viewable]:
    """Prompt modes, models and rules side by side, then demographics."""
    items: list[pn.viewable.Viewable] = [markdown("## Comparisons")]
    for frame, key, what in [
        (data.by_prompt_mode, "prompt_mode", "prompt mode"),
        (data.by_model, "model", "model"),
        (data.by_rule, "rule", "game rule"),
    ]:
        # One plot per comparison that has something to compare.
        if frame[key].n_unique() > 1:
            items.append(CompareByRound(frame, key, f"Mean guess per round by {what}"))
        elif frame.height:
            items.append(markdown(f"One {what} on this page: {plain(frame[key][0])}."))
    attributes = [a for a in data.by_attribute["attribute"].unique(maintain_order=True).to_list()
                  if data.by_attribute.filter(pl.col("attribute") == a)["value"].n_unique() <= MAX_VALUES_PLOTTED]
    if attributes:
        labels = {a: data.arm_label(a) for a in data.arms["arm"].to_list()}
        first = int(data.by_attribute["round"].min())
        items += [markdown("### Demographics"),
                  markdown(f"Mean guess of each group in round {first}, per arm; bars are 95 % confidence intervals "
                      "(mean ± 1.96 standard errors)."),
                  grid([ByAttribute(data.by_attribute, a, first, labels) for a in attributes], columns=2)]
    return items


def answers_and_cost(data: ReportData) -> list[pn.viewable.Viewable]:
    """Invalid-answer rates, token and latency summaries."""
    labels = {a: data.arm_label(a) for a in data.arms["arm"].to_list()}
    invalid = data.invalid.group_by("arm", maintain_order=True).agg(
        n=pl.col("n").sum(), n_invalid=pl.col("n_invalid").sum()).with_columns(invalid_rate=pl.col("n_invalid") / pl.col("n"))
    items: list[pn.viewable.Viewable] = [
        markdown("## Answers and cost"),
        BarsByArm(invalid, "invalid_rate", "Invalid answers by arm (all rounds)"
                  + ("" if invalid["n_invalid"].sum() else ": none"), "% of answers", labels, scale=100),
    ]
    if data.invalid_reasons.height:
        items += [markdown("Why answers were invalid:"),
                  table(data.invalid_reasons, {"arm": "arm", "error": "reason", "n": "answers"})]
    usage = data.usage
    items += [
        BarsByArm(usage, "latency_mean_s", "Mean latency per guess by arm", "seconds", labels),
        table(usage, {"arm": "arm", "model": "model", "prompt_mode": "prompt mode", "guesses": "guesses",
                      "prompt_tokens": "prompt tokens", "completion_tokens": "completion tokens",
                      "prompt_tokens_per_guess": "prompt tokens / guess",
                      "completion_tokens_per_guess": "completion tokens / guess",
                      "latency_mean_s": "latency mean (s)", "latency_p50_s": "p50 (s)", "latency_p95_s": "p95 (s)",
                      "retries": "retries", "play_s": "play time (s)"}, digits=3),
    ]
    return items


def references(data: ReportData) -> list[pn.viewable.Viewable]:
    """The human reference results drawn on the page, with their sources."""
    refs = data.references.unique(["source", "round", "mean", "median"], maintain_order=True)
    if refs.is_empty():
        return [markdown("Human reference lines: none published for this experiment's rule(s) in the warehouse's "
                    "`human_reference` view.")]
    lines = "\n".join(f"- {r['source']}: round {r['round']} mean {fmt(r['mean'])}, median {fmt(r['median'])} "
                      "(green lines and stars)" for r in refs.iter_rows(named=True))
    return [markdown("### Human reference results\n" + lines)]


def provenance_footer(data: ReportData) -> list[pn.viewable.Viewable]:
    """What computed the answers, session by session: keynes and its commit, Python, packages,
    machine, models and templates (``keynes show`` prints the same)."""
    if not data.provenance:
        return [markdown("## Provenance\nNone recorded: these rounds were played before keynes recorded provenance.")]
    return [markdown("## Provenance"), text_block("\n".join(line for s in data.provenance for line in session_lines(s)))]


def build_page(data: ReportData, title: str | None = None, served: bool = False) -> pn.template.BaseTemplate:
    """The whole page of one experiment (or a comparison of several) as a Panel template.

    ``served`` pages (``keynes report --serve``) add a searchable table of every reasoning text.
    """
    o = data.overview
    page = pn.template.BootstrapTemplate(
        title=plain(title or f"keynes report · {' vs '.join(data.labels[e] for e in data.experiment_ids)}"),  # the header shows it as HTML
        header_background=HEADER_COLOR,
        sidebar_width=230,
    )
    created = o["created_at"].strftime("%Y-%m-%d %H:%M UTC") if o["created_at"] else "–"
    page.sidebar.append(markdown(
        f"**Experiment** <code>{plain(o['experiment_id'])}</code>\n\n**Started** {created}\n\n**Status** {o['status']}\n\n"
        f"**Agents** {o['population']:,}\n\n**Arms** {o['arms']}\n\n**Guesses** {o['guesses']:,}\n\n"
        f"**Report built** {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}"
    ))
    main = overview(data) + [markdown("## Arms")]
    for arm in data.arms["arm"].to_list():
        main += arm_section(data, arm)
    main += published_pools(data)
    main += comparisons(data) + reasoning_depth(data) + exact_answers(data) + paired_comparisons(data) + read_the_agents(data, served)
    main += answers_and_cost(data) + references(data)
    for row in data.experiments.iter_rows(named=True):
        main += [markdown(f"## Config{': ' + plain(data.labels[row['experiment_id']]) if data.comparing else ''}"), config_block(row["config"])]
    main += provenance_footer(data)
    page.main.append(pn.Column(*main, sizing_mode="stretch_width"))
    return page
