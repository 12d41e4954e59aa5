"""The quickstart ends with a report page; it works offline in real headless Chromium.

The quickstart is the session's one run (``quickstart`` in tests/conftest.py: 10 agents).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

import duckdb
import numpy as np
import pytest
from PIL import Image

from tests.conftest import QUICKSTART_ROUNDS, REPO
from tests.reports.browser import CHROMIUM, Chromium

pytestmark = pytest.mark.llm  # the quickstart's agents are the real Gemma 3 270M



@pytest.fixture(scope="module")
def page(quickstart, tmp_path_factory):
    """The quickstart's report opened offline in Chromium: load record, text, plots, screenshot."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    _, summary = quickstart
    html = open(summary.report, encoding="utf-8").read()
    figures = len(re.findall(r'"name":"Figure"', html))
    shot = tmp_path_factory.mktemp("shots") / "report.png"
    with Chromium() as browser:
        load = browser.open("file://" + summary.report, canvases=figures)
        plots = browser.canvases()
        text = browser.text()
        browser.screenshot(shot)
    return {"html": html, "figures": figures, "load": load, "plots": plots, "text": text, "shot": shot}


def test_the_quickstart_ends_with_a_report_file(quickstart):
    path, summary = quickstart
    assert summary.report == str(path.with_name("quickstart-report.html"))
    size = os.path.getsize(summary.report)
    assert 1_000_000 < size < 6_000_000, size  # inlined Bokeh + Panel, no bloat


def test_the_page_links_nothing_from_the_network(page):
    tags = re.findall(r"<(?:script|link)\b[^>]*>", page["html"])
    assert not [t for t in tags if re.search(r"(?:src|href)=[\"']https?://", t)]
    fetched = [u for u in page["load"].requests if not u.startswith(("file:", "data:", "blob:"))]
    assert fetched == [] and page["load"].failed == []


def test_no_console_errors(page):
    assert page["load"].errors == []


def test_every_plot_renders(page):
    plots = page["plots"]
    assert page["figures"] >= 2 * QUICKSTART_ROUNDS + 2 + 3  # histograms per arm and round, convergence, comparisons
    assert len(plots) == page["figures"]
    assert all(p["shown"] and p["inked"] > 100 for p in plots), plots


def test_the_screenshot_is_not_blank(page):
    image = np.asarray(Image.open(page["shot"]).convert("L"), dtype=float)
    assert image.shape[0] > 2000  # the whole page, not one screen
    assert (image < 200).mean() > 0.03 and image.std() > 20


def test_key_numbers_are_on_the_page(quickstart, page):
    path, _ = quickstart
    with duckdb.connect(str(path), read_only=True) as con:
        rounds = con.execute("select round, target, mean, winning_guess from rounds order by run_id, round").fetchall()
    assert len(rounds) == 2 * QUICKSTART_ROUNDS
    for round_, target, mean, winning in rounds:
        for value in (target, mean, winning):
            assert f"{value:,.2f}" in page["text"], (round_, value)
    for words in ("Nagel (1995)", "36.73", "llamacpp", "Arms", "Population (10 agents)"):
        assert words in page["text"], words
    # plot titles are drawn on the canvases: they are in the page's document
    for title in ("Convergence across rounds: arm 0", f"Round {QUICKSTART_ROUNDS}: guesses", "Mean guess per round by prompt mode",
                  "Mean guess by education", "Invalid answers by arm", "Mean latency per guess by arm"):
        assert title in page["html"], title


def test_reasoning_sections_show_the_stored_analyses(quickstart, page):
    path, _ = quickstart
    text = page["text"]
    for words in ("Reasoning depth", "Paired comparisons", "Read the agents", "Caltech board", "Camerer, Ho & Chong (2004)"):
        assert words in text, words
    with duckdb.connect(str(path), read_only=True) as con:
        fits = con.execute("SELECT tau, fit FROM cognitive_hierarchy_fit WHERE attribute IS NULL").fetchall()
        pairs = con.execute("SELECT mean_difference, factor FROM paired_comparisons").fetchall()
        picks = con.execute("SELECT pick, agent_id, reasoning FROM reasoning_highlights").fetchall()
    assert len(fits) == 2 * QUICKSTART_ROUNDS and all((f"{t:.2f}" in text) if t is not None else fit == "no τ fits" for t, fit in fits)
    assert len(pairs) == QUICKSTART_ROUNDS and {f for _, f in pairs} == {"prompt mode"}  # basic vs cot, every round
    # The quickstart's answers come from exact distributions: their expected answer per education level.
    with duckdb.connect(str(path), read_only=True) as con:
        exact = con.execute("SELECT count(*) FROM exact_answers_by_attribute WHERE attribute = 'education' AND round = 1").fetchall()
    assert exact[0][0] == 2 * 5  # two arms × five education levels
    assert "Exact expected answer by persona group (round 1)" in text and "Exact expected answer by education" in page["html"]
    assert all(f"{d:.4f}" in text for d, _ in pairs)
    # Gemma's chain-of-thought texts, with the agents' numbers, for the lowest/median/highest guesses and winners
    assert {p for p, _, _ in picks} >= {"lowest", "median", "highest", "winner"}
    for _, agent_id, reasoning in picks:
        assert f"agent {agent_id}" in text
        assert " ".join(reasoning.split())[:60] in " ".join(text.split())
    for title in ("Level-k classes of round 1", "Cognitive-hierarchy ", "Paired difference a "):
        assert title in page["html"], title


def test_one_plot_per_comparison_with_more_than_one_level(page):
    # two prompt modes are compared; the one model and the one rule get a line of text, not a plot
    assert "Mean guess per round by prompt mode" in page["html"]
    assert "Mean guess per round by model" not in page["html"] and "Mean guess per round by game rule" not in page["html"]
    assert "One model on this page" in page["text"] and "One game rule on this page" in page["text"]


def test_plots_use_the_page_width(page):
    width = max(p["width"] for p in page["plots"])
    assert width > 900, width  # the 1400-pixel window less the sidebar, not a fixed 760-pixel box


def test_prefect_artifacts_summarise_rounds_and_link_the_report(quickstart):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.monitor import artifact_key

    path, summary = quickstart
    key = artifact_key(summary.experiment_id)
    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-rounds", f"{key}-report"])))}
    assert set(artifacts) == {f"{key}-rounds", f"{key}-report"}
    markdown = artifacts[f"{key}-rounds"].data
    with duckdb.connect(str(path), read_only=True) as con:
        targets = [r[0] for r in con.execute("select target from rounds").fetchall()]
    assert markdown.count("| ") > 6 and all(f"{t:.4g}" in markdown for t in targets)
    assert summary.report in artifacts[f"{key}-report"].data


def keynes(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True, cwd=REPO, timeout=timeout)


def test_keynes_report_writes_a_page_by_name(quickstart, tmp_path):
    path, _ = quickstart
    out = tmp_path / "again.html"
    result = keynes("report", "--db", str(path), "--experiment", "quickstart", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.exists() and "Convergence across rounds" in out.read_text()
    missing = keynes("report", "--db", str(path), "--experiment", "nope", "--out", str(out))
    assert missing.returncode == 2 and "experiment 'nope' not found; available: quickstart" in missing.stderr


def test_keynes_report_serve_answers_on_localhost(quickstart):
    path, summary = quickstart
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "cli.app", "report", "--db", str(path), "--serve", "--port", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline, body = time.monotonic() + 180, ""
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/experiment?id={summary.experiment_id}", timeout=60) as response:
                    body = response.read().decode()
                    break
            except OSError:
                time.sleep(1)
        assert server.poll() is None, server.stderr.read()
        assert "keynes report" in body and "bokeh" in body.lower()
        # It listens on the loopback only (nobody else on the network can reach it).
        import psutil

        family = {server.pid} | {p.pid for p in psutil.Process(server.pid).children(recursive=True)}
        hosts = {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid in family}
        assert hosts and hosts <= {"127.0.0.1"}, hosts
    finally:
        server.terminate()
        server.wait(timeout=30)
