"""Published LLM pools on the report page, in real headless Chromium.

A warehouse filled through the store API holds an arm of a model with a published pool (Qwen2-72B),
a Gemma arm (none published) and an arm of another game (none played it): the page marks the Qwen
arm's pool and sets the Gemma arm beside every pool. The quickstart's page (real Gemma 3 270M
agents, ``quickstart`` in tests/conftest.py) must show the published pools beside its arms.
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
from warehouse.llm_references import LLM_REFERENCE

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


def test_the_arm_of_a_published_model_stands_beside_its_pool(filled, page):
    text = page["text"]
    means = first_round_means(filled)
    assert (f"◆ Published round-1 mean of this model: Qwen-2-72B 40.06 (n = 50, basic, GAMA-Bench (Huang et al. 2025)). "
            f"This arm's round-1 mean: {means[0]:.2f}.") in text
    # the table marks the Qwen arm and the Qwen pool, and names each other's row
    assert text.count("◆") == 1 + 2 + 1  # the arm's line, two table rows, the legend sentence
    assert "Qwen-2-72B · GAMA-Bench" in text and "arm 0 · basic · Qwen/Qwen2-72B-Instruct" in text


def test_a_gemma_arm_shows_the_published_pools_beside_it(filled, page):
    text = page["text"]
    means = first_round_means(filled)
    assert (f"No published round-1 mean of gemma-3-270m in llm_reference; this arm's round-1 mean ({means[1]:.2f}) stands "
            f"beside {len(LLM_REFERENCE)} published LLM pools of the same game under Published LLM pools.") in text
    section = pools_section(text)
    for ref in LLM_REFERENCE:  # every pool, its value and its source's citation
        assert f"{ref.model} · GAMA-Bench" in section and f"{ref.value:.2f}" in section, ref.model
    assert f"{means[1]:.2f}" in section and "arm 1 · cot · gemma-3-270m" in section
    assert "arXiv 2403.11807" in section and "github.com/CUHK-ARISE/GAMABench/tree/41ebccf" in section
    assert "arm 2 · basic · fixture/b" not in section  # its game (1/2 of the mean + 5) has no published pool


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
    assert all(f"{ref.model} · GAMA-Bench" in section for ref in LLM_REFERENCE)
    assert "◆ Published" not in text  # no pool is Gemma's own
