"""The reasoning sections and the comparison page, in real headless Chromium.

Two small simulated experiments in one warehouse (a chain-of-thought arm stores the engine's
labelled stand-in texts): `keynes report --experiment A --experiment B` writes one page
comparing them, which must draw every plot without a console error; the served page adds a
filterable table of every reasoning text. The quickstart's page (real Gemma reasoning) is
checked in ``test_report.py``.
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
import pytest

from flows.experiment import experiment
from reports.urls import page_url
from tests.conftest import REPO
from tests.reports.browser import CHROMIUM, Chromium


def config(name: str, tau: float) -> dict:
    return {
        "name": name,
        "seed": 3,
        "population": {"spec": "education.yaml", "size": 200},
        "game": {"ratio": "2/3", "rounds": 2},
        "arms": {"engines": [{"kind": "simulated", "rule": "cognitive_hierarchy", "tau": tau}], "prompts": ["basic", "cot"]},
        "workers": {"actors": 1, "shard_size": 100},
        "report": {"enabled": False},
    }


@pytest.fixture(scope="module")
def two(tmp_path_factory, prefect_api, local_ray):
    path = tmp_path_factory.mktemp("compare") / "keynes.duckdb"
    experiment(config("last-week", 1.0), db=str(path))
    experiment(config("today", 2.5), db=str(path))
    return path


def keynes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def page(two, tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    out = tmp_path_factory.mktemp("page") / "compare.html"
    result = keynes("report", "--db", str(two), "--experiment", "last-week", "--experiment", "today", "--out", str(out))
    assert result.returncode == 0, result.stderr
    html = out.read_text(encoding="utf-8")
    figures = len(re.findall(r'"name":"Figure"', html))
    with Chromium() as browser:
        load = browser.open(out.as_uri(), canvases=figures)
        plots, text = browser.canvases(), browser.text()
        width = browser.evaluate("document.querySelector('#main') ? document.querySelector('#main').clientWidth : window.innerWidth")
    return {"html": html, "figures": figures, "load": load, "plots": plots, "text": text, "width": width}


def test_the_comparison_page_draws_every_plot_without_errors(page):
    assert page["load"].errors == []
    assert page["figures"] >= 12 and len(page["plots"]) == page["figures"]
    assert all(p["shown"] and p["inked"] > 100 for p in page["plots"]), page["plots"]


def test_the_comparison_page_labels_arms_by_experiment(two, page):
    text = page["text"]
    for words in ("last-week · arm 0 · basic", "today · arm 1 · cot", "Reasoning depth", "Paired comparisons",
                  "Read the agents", "Config: last-week", "Config: today", "Game theorists"):
        assert words in text, words
    # both experiments' fitted τ are on the page, as stored
    with duckdb.connect(str(two), read_only=True) as con:
        taus = [r[0] for r in con.execute("SELECT tau FROM cognitive_hierarchy_fit WHERE attribute IS NULL").fetchall()]
    assert len(taus) == 2 * 2 * 2 and all(f"{t:.2f}" in text for t in taus)


def test_plots_use_the_page_width(page):
    widths = sorted(p["width"] for p in page["plots"])
    # the widest plots span (nearly) the main column; none is a fixed narrow box on a wide page
    assert widths[-1] > 0.8 * page["width"], (widths[-1], page["width"])


def test_groups_of_a_comparison_are_keyed_by_experiment(page):
    # each experiment's prompt modes are their own groups (the one-level case: test_report.py)
    assert "Mean guess per round by prompt mode" in page["html"]
    for key in ("last-week: basic", "today: cot", "today: simulated/cognitive_hierarchy(tau=2.5)"):
        assert key in page["html"], key


def test_reasoning_texts_of_the_cot_arms_are_on_the_page(two, page):
    with duckdb.connect(str(two), read_only=True) as con:
        picks = con.execute("SELECT pick, reasoning FROM reasoning_highlights").fetchall()
    assert {p for p, _ in picks} == {"lowest", "median", "highest", "winner"}
    for _, reasoning in picks:
        assert reasoning in page["text"]
    assert "labelled stand-ins" in page["text"]


def test_the_served_page_has_a_filterable_table_of_every_reasoning_text(two):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "cli.app", "report", "--db", str(two), "--experiment", "today",
                               "--serve", "--port", str(port)], cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        with duckdb.connect(str(two), read_only=True) as con:
            experiment_id, n_texts = con.execute(
                "SELECT experiment_id, count(*) FROM reasoning_texts JOIN experiments USING (experiment_id) "
                "WHERE name = 'today' GROUP BY ALL").fetchall()[0]
        url = page_url(f"http://127.0.0.1:{port}", experiment_id)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(url, timeout=60).read()
                break
            except OSError:
                time.sleep(1)
        assert server.poll() is None, server.stderr.read()
        with Chromium(allow=("127.0.0.1",)) as browser:
            load = browser.open(url, canvases=8, timeout_s=120)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "guess range" not in browser.text():
                time.sleep(1)
            text = browser.text()
        assert load.errors == []
        assert "Every reasoning text" in text and "guess range" in text
        # the table's first page of rows holds stored texts
        assert text.count("(simulated text #") >= 20 and n_texts == 200 * 2
    finally:
        server.terminate()
        server.wait(timeout=30)
