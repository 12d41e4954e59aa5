"""Layout: the page's arms beside published LLM pools of the same game (the ``llm_reference`` view).

``published_pools`` is the page's section (a plot and a table of round-1 means, arms and pools
together, the pool of an arm's own model marked, then each source's citation); ``arm_published``
is the line under an arm's round table, ``arm_paper`` the table of its round means beside the seed
paper's for its prompt mode. Nothing is computed here.
"""

from __future__ import annotations

import panel as pn
import polars as pl

from reports.data import ReportData
from reports.figures import PoolMeans, fmt, markdown, plain, table
from warehouse.llm_references import PAPER_PROMPTS, PAPER_SHORT

#: Marks a row whose model has a published pool on the page (and that pool).
SAME = "◆"


def arm_published(data: ReportData, arm: int) -> list[pn.viewable.Viewable]:
    """The published round-1 mean of the arm's own model beside the arm's, or, when none is
    published, a pointer to the pools of the same game; nothing when no pool played its rule."""
    pools = data.llm_pools.filter((pl.col("arm") == arm) & (pl.col("round") == 1) & (pl.col("statistic") == "mean"))
    if pools.is_empty():
        return []
    first = data.rounds.filter((pl.col("arm") == arm) & (pl.col("round") == 1))
    mean = fmt(first["mean"][0] if first.height else None)
    same = pools.filter(pl.col("same_model"))
    if same.height:
        published = "; ".join(plain(f"{r['model']} {fmt(r['value'])} ({_n(r['n'])}, {r['prompt_mode']}, {r['source']})")
                              for r in same.iter_rows(named=True))
        return [markdown(f"{SAME} **Published round-1 mean of this model:** {published}. This arm's round-1 mean: {mean}.")]
    model = data.arms.filter(pl.col("arm") == arm)["model"][0]
    return [markdown(f"No published round-1 mean of {plain(model)} in `llm_reference`; this arm's round-1 mean ({mean}) stands beside "
                f"{pools.height} published LLM pools of the same game under *Published LLM pools*.")]


def _n(n: int | None) -> str:
    return "n not stated" if n is None else f"n = {n}"


def arm_paper(data: ReportData, arm: int) -> list[pn.viewable.Viewable]:
    """The arm's mean per round beside the seed paper's average guesses for its prompt mode and round,
    one column per model of the paper (the arm's own model marked); one line when the paper used
    no such prompt; nothing when the arm plays a game the paper did not."""
    rows = data.paper_rounds.filter(pl.col("arm") == arm)
    if rows.is_empty():
        return []
    mode = data.arms.filter(pl.col("arm") == arm)["prompt_mode"][0]
    figures = rows.filter(pl.col("model").is_not_null())
    if figures.is_empty():
        used = ", ".join(f"{m} ({p})" for m, (p, _) in PAPER_PROMPTS.items())
        return [markdown(f"The seed paper ({PAPER_SHORT}) prints no average guess for prompt mode {plain(mode)}; "
                         f"its figures are for {used}.")]
    models = figures["model"].unique(maintain_order=True).to_list()
    same = set(figures.filter(pl.col("same_model"))["model"].to_list())
    wide = rows.select("round", "mean", "n_valid").unique(maintain_order=True).join(
        figures.pivot(on="model", index="round", values="value"), on="round", how="left")
    prompt, words = PAPER_PROMPTS[mode]
    return [
        markdown(f"**The seed paper beside this arm** ({PAPER_SHORT}): the average guess of each of "
                 f"its models under {prompt} ({words}; keynes's {plain(mode)}), round 1 from its models × prompts "
                 "experiment, later rounds from its five-round experiment; – where it prints none."
                 + (f" {SAME} marks this arm's own model." if same else "")),
        table(wide, {"round": "round", "mean": "this arm", "n_valid": "valid guesses",
                     **{m: f"{m} {SAME}" if m in same else m for m in models}}),
    ]


def published_pools(data: ReportData) -> list[pn.viewable.Viewable]:
    """Round-1 means of the arms beside published LLM pools of their game, with the sources."""
    items: list[pn.viewable.Viewable] = [markdown("## Published LLM pools")]
    pools = data.pool_table
    if pools.is_empty():
        return items + [markdown("None published for this page's rule(s) in the warehouse's `llm_reference` view.")]
    shown = pools.with_columns(mark=pl.when(pl.col("same_model").is_not_null()).then(pl.lit(SAME)).otherwise(pl.lit("")))
    sources = data.llm_pools.unique("source", maintain_order=True)
    items += [
        markdown(f"Round-1 mean guess of LLM players in published studies of the same game, beside this page's arms (their "
            f"valid guesses in round 1). {SAME} marks an arm and the published pool of its own model; a model with no "
            "published pool (a Gemma arm, say) has the published pools as context. Games differ in players, prompts "
            "and answers: each source's setting is below."),
        PoolMeans(pools, "Round-1 mean guess: this page's arms and published LLM pools"),
        table(shown, {"mark": "", "player": "player", "prompt_mode": "prompt mode", "mean": "round-1 mean",
                      "n": "valid guesses", "source": "source", "same_model": "same model as"}),
        markdown("\n".join(f"- **{r['source']}**: {r['setting']}. {r['citation']}. Data: <{r['url']}>"
                      for r in sources.iter_rows(named=True))),
    ]
    return items
