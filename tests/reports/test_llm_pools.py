"""Published LLM pools and the seed paper's figures on the report page, in real headless Chromium.

A warehouse filled through the store API holds an arm of a model with published pools (Qwen2-72B),
a Gemma arm (none published) and an arm of another game (none played it): the page marks the Qwen
arm's pools and sets the Gemma arm beside every pool, and sets each arm's round means beside the
seed paper's for its prompt mode, round by round. The quickstart's page (real Gemma 3 270M agents,
``quickstart`` in tests/conftest.py) must show both beside its arms.
"""

from __future__ import annotations

import os
import re

import duckdb
import pytest

from core.game import GameRule
from reports.export import write_reports
from tests.reports.browser import CHROMIUM, Chromium
from tests.warehouse.conftest import fill
from warehouse.llm_references import LLM_REFERENCE, PAPER_SOURCE

GAMA = [r for r in LLM_REFERENCE if r.source != PAPER_SOURCE]
ROUND_ONE = [r for r in LLM_REFERENCE if r.round == 1]
#: The seed paper's figures by prompt mode and round: {model: value}, the models in the paper's order.
PAPER = {}
for _r in LLM_REFERENCE:
    if _r.source == PAPER_SOURCE:
        PAPER.setdefault((_r.prompt_mode, _r.round), {})[_r.model] = _r.value

ARMS = [
    (0, "basic", "Qwen/Qwen2-72B-Instruct", GameRule(ratio="2/3", rounds=2)),
    (1, "cot", "gemma-3-270m", GameRule(ratio="2/3", rounds=2)),
    (2, "basic", "fixture/b", GameRule(ratio="1/2", offset=5, rounds=2)),
]


def rendered(path: str) -> dict:
    """The page at ``path`` opened offline in Chromium: its html, load record, plots and text."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    html = open(path, encoding="utf-8").read()
    figures = len(re.findall(r'"name":"Figure"', html))
    with Chromium() as browser:
        load = browser.open("file://" + str(path), canvases=figures)
        plots, text = browser.canvases(), browser.text()
    # one space between words, none before punctuation (inline code and emphasis add some)
    text = re.sub(r" ([;.,:)])", r"\1", " ".join(text.split()))
    return {"html": html, "figures": figures, "load": load, "plots": plots, "text": text}


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    path = tmp_path_factory.mktemp("pools") / "pools.duckdb"
    fill(path, ARMS)
    return path


@pytest.fixture(scope="module")
def page(filled):
    (out,) = write_reports(filled, filled.with_name("pools.html"))
    return rendered(str(out))


def pools_section(text: str) -> str:
    """The page's text from the Published LLM pools section's introduction to its last source's data link."""
    start = text.index("Round-1 mean guess of LLM players")
    return text[start:text.index("/raw_results/guessing_game", start)]


def first_round_means(path) -> dict[int, float]:
    with duckdb.connect(str(path), read_only=True) as con:
        return dict(con.execute("SELECT arm, mean FROM round_summary WHERE round = 1").fetchall())


def paper_tables(path, own: dict[int, str] | None = None) -> dict[int, str]:
    """Each arm's expected table beside the seed paper, as the page's text reads it: its rounds'
    means and valid guesses, then the paper's figures for its prompt mode and round (– where none);
    ``own`` maps an arm to the paper's name of its model (its column marked)."""
    with duckdb.connect(str(path), read_only=True) as con:
        rounds = con.execute("SELECT arm, prompt_mode, round, mean, n_valid FROM round_summary ORDER BY arm, round").fetchall()
    models = list(PAPER["basic", 1])
    tables: dict[int, str] = {}
    for arm, mode, round_, mean, n_valid in rounds:
        marked = (own or {}).get(arm)
        head = tables.get(arm, "round this arm valid guesses " + " ".join(m + " ◆" * (m == marked) for m in models))
        figures = PAPER.get((mode, round_), {})
        tables[arm] = f"{head} {round_} {mean:.2f} {n_valid:,} " + " ".join(f"{figures[m]:.2f}" if m in figures else "–" for m in models)
    return tables


def test_the_arm_of_a_published_model_stands_beside_its_pool(filled, page):
    text = page["text"]
    means = first_round_means(filled)
    paper = "AgentScope paper (Pan et al. 2024)"
    assert (f"◆ Published round-1 mean of this model: Qwen2-72B 8.15 (n not stated, cot_rational, {paper}); "
            f"Qwen2-72B 8.85 (n not stated, cot_strategic, {paper}); Qwen2-72B 19.15 (n not stated, cot, {paper}); "
            f"Qwen-2-72B 40.06 (n = 50, basic, GAMA-Bench (Huang et al. 2025)); Qwen2-72B 50.56 (n not stated, basic, {paper}). "
            f"This arm's round-1 mean: {means[0]:.2f}.") in text
    # the table marks the Qwen arm and the Qwen pools (GAMA-Bench's and the paper's four), and names each other's row
    # the arm's line, six table rows, the legend sentence, the paper's Qwen2-72B column and the sentence above it
    assert text.count("◆") == 1 + 6 + 1 + 2
    assert "Qwen-2-72B · GAMA-Bench · basic" in text and "Qwen2-72B · AgentScope paper · cot" in text
    assert "arm 0 · basic · Qwen/Qwen2-72B-Instruct" in text


def test_a_gemma_arm_shows_the_published_pools_beside_it(filled, page):
    text = page["text"]
    means = first_round_means(filled)
    assert (f"No published round-1 mean of gemma-3-270m in llm_reference; this arm's round-1 mean ({means[1]:.2f}) stands "
            f"beside {len(ROUND_ONE)} published LLM pools of the same game under Published LLM pools.") in text
    section = pools_section(text)
    for ref in ROUND_ONE:  # every round-1 pool, its value and its source's citation
        assert f"{ref.model} · {ref.source.split(' (')[0]} · {ref.prompt_mode}" in section and f"{ref.value:.2f}" in section, ref
    assert f"{means[1]:.2f}" in section and "arm 1 · cot · gemma-3-270m" in section
    assert "arXiv 2403.11807" in section and "github.com/CUHK-ARISE/GAMABench/tree/41ebccf" in section
    assert "Very Large-Scale Multi-Agent Simulation in AgentScope, arXiv 2407.17789v2" in section
    assert "arm 2 · basic · fixture/b" not in section  # its game (1/2 of the mean + 5) has no published pool


def test_each_arm_stands_beside_the_papers_figures_for_its_prompt_mode_round_by_round(filled, page):
    text, tables = page["text"], paper_tables(filled, own={0: "Qwen2-72B"})
    assert ("The seed paper beside this arm (Pan et al. 2024, arXiv 2407.17789v2): the average guess of each of its models "
            "under P1 (directly report your number; keynes's basic)") in text
    assert "◆ marks this arm's own model. " + tables[0] in text  # Qwen2-72B's P1, five rounds: three played here
    assert "under P2 (think step by step, then report your number; keynes's cot)" in text
    assert "– where it prints none. " + tables[1] in text  # the Gemma arm: no mark
    assert tables[1].count("–") == 2 * 5 and "11.06" in tables[1]
    assert text.count("The seed paper beside this arm") == 2  # arm 2 plays 1/2 of the mean + 5: the paper did not


def test_the_pools_plot_renders_without_errors(page):
    assert page["load"].errors == []
    assert "Round-1 mean guess: this page" in page["html"]
    assert len(page["plots"]) == page["figures"] and all(p["shown"] and p["inked"] > 100 for p in page["plots"])


@pytest.mark.llm  # the quickstart's agents are the real Gemma 3 270M
def test_the_quickstart_report_shows_the_published_pools_beside_its_gemma_arms(quickstart):
    path, summary = quickstart
    shown = rendered(summary.report)
    text, means = shown["text"], first_round_means(path)
    assert shown["load"].errors == []
    with duckdb.connect(str(path), read_only=True) as con:
        models = {m for (m,) in con.execute("SELECT DISTINCT model FROM runs").fetchall()}
    assert models == {"gemma-3-270m"}
    assert text.count("No published round-1 mean of gemma-3-270m in llm_reference") == len(means) == 2
    section = pools_section(text)
    assert all(f"{m:.2f}" in section for m in means.values())
    assert all(f"{ref.model} · GAMA-Bench" in section for ref in GAMA)
    assert "◆ Published" not in text and "◆ marks this arm's own model" not in text  # no pool is Gemma's own
    # each arm (basic, cot) beside the paper's P1 and P2 figures, round by round
    tables = paper_tables(path)
    assert len(tables) == 2 and all(t in text for t in tables.values())
