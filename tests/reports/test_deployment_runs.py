"""Two runs of one deployment on report pages, in real headless Chromium.

A deployment's runs share the experiment's name; their configs differ, so their ids
(``NAME-<config hash>``) do. `keynes report --experiment A --experiment B` compares them on one
page, `keynes report --serve` serves it, and every page fits a 1366-pixel-wide screen.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from flows.experiment import experiment
from tests.conftest import REPO
from tests.reports.browser import CHROMIUM, Chromium
from tests.support.sql import q
from tests.support.waiting import answers, free_port, wait_for

#: One deployment's config; its runs differ in the seed (as a run form's parameters would).
RUN = {
    "name": "quickstart",
    "population": {"spec": "education.yaml", "size": 100},
    "game": {"ratio": "2/3", "rounds": 3},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic", "cot"]},
    "workers": {"actors": 1, "shard_size": 100},
    "report": {"enabled": False},
}
#: What Bokeh prints when a document fails its validation (e.g. E-1019 DUPLICATE_FACTORS).
VALIDATION = re.compile(r"bokeh\.core\.validation|\b[EW]-1\d{3}\b")
#: A common laptop screen, the narrowest the pages are laid out for.
NARROW = 1366


def keynes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prefect_api, local_ray) -> tuple:
    """Two runs of one deployment in one warehouse: (path, their experiment ids)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    db = tmp_path_factory.mktemp("deployment") / "keynes.duckdb"
    ids = [experiment({**RUN, "seed": seed}, db=str(db)).experiment_id for seed in (3, 4)]
    assert ids[0] != ids[1] and all(e.startswith("quickstart-") for e in ids)
    assert q(db, "SELECT DISTINCT name FROM experiments") == [("quickstart",)]
    return db, ids


@pytest.fixture(scope="module")
def pages(runs, tmp_path_factory) -> dict:
    """`keynes report` of the first run, and of both runs compared: name → (file, what it printed)."""
    db, ids = runs
    folder = tmp_path_factory.mktemp("pages")
    written = {}
    for name, experiments in {"one": ids[:1], "compare": ids}.items():
        out = folder / f"{name}.html"
        result = keynes("report", "--db", str(db), *[a for e in experiments for a in ("--experiment", e)], "--out", str(out))
        assert result.returncode == 0, result.stderr
        written[name] = (out, result.stderr)
    return written


def test_two_runs_of_one_deployment_compare_on_one_drawn_page(runs, pages):
    _, ids = runs
    out, printed = pages["compare"]
    html = out.read_text(encoding="utf-8")
    figures = len(re.findall(r'"name":"Figure"', html))
    with Chromium() as browser:
        load = browser.open(out.as_uri(), canvases=figures, timeout_s=60)
        plots, text = browser.canvases(), browser.text()
    assert load.errors == []
    assert figures >= 12 and len(plots) == figures and all(p["shown"] and p["inked"] > 100 for p in plots), plots
    assert not VALIDATION.search(printed), printed
    # The runs' names are the same: arms, groups and configs are labelled by the runs' ids.
    for e in ids:
        for words in (f"{e} · arm 0 · basic", f"{e} · arm 1 · cot", f"Config: {e}"):
            assert words in text, words
        assert f"{e}: basic" in html
    assert f"keynes report · {ids[0]} vs {ids[1]}" in text


def test_the_report_server_prints_no_bokeh_validation_messages(runs, pages, tmp_path):
    db, ids = runs
    port, log = free_port(), tmp_path / "server.log"
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as stderr:
        server = subprocess.Popen([sys.executable, "-m", "cli.app", "report", "--serve", "--db", str(db), "--port", str(port)],
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    errors, drawn = {}, {}
    try:
        wait_for(lambda: server.poll() is not None or answers(base + "/"), 120, "the report server")
        assert server.poll() is None, log.read_text()
        with Chromium(allow=("127.0.0.1",)) as browser:
            for path, canvases in [("/", 0), (f"/experiment?id={ids[0]}", 10), (f"/experiment?id={ids[0]}&id={ids[1]}", 10)]:
                errors[path] = browser.open(base + path, canvases=canvases, timeout_s=60).errors
                drawn[path] = canvases == 0 or "Config" in browser.text()  # the whole page
    finally:
        server.terminate()
        server.wait(timeout=30)
    printed = log.read_text()
    assert "serving every experiment" in printed and not VALIDATION.search(printed), printed
    assert all(drawn.values()) and not any(errors.values()), (drawn, errors)


def _inside(box: dict, frame: dict) -> bool:
    return all(box[side] >= frame[side] - 1 for side in ("left", "top")) and all(
        box[side] <= frame[side] + 1 for side in ("right", "bottom"))


def _overlap(a: dict, b: dict) -> bool:
    return min(a["right"], b["right"]) - max(a["left"], b["left"]) > 1 and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > 1


@pytest.mark.parametrize("name", ["one", "compare"])
def test_on_a_1366_pixel_screen_every_title_and_legend_shows_whole(pages, name):
    out, _ = pages[name]
    figures = len(re.findall(r'"name":"Figure"', out.read_text(encoding="utf-8")))
    with Chromium(width=NARROW) as browser:
        browser.open(out.as_uri(), canvases=figures, timeout_s=60)
        plots = browser.plots()
        width = browser.evaluate("document.documentElement.clientWidth")
    assert len(plots) == figures and all(p["titles"] for p in plots) and sum(len(p["legends"]) for p in plots) >= 10
    clipped = [(p["title"], kind) for p in plots for kind in ("titles", "legends") for box in p[kind] if not _inside(box, p["canvas"])]
    assert clipped == [], clipped
    # Every canvas on the page, none over another (a canvas wider than its column spills onto its neighbour).
    assert [p["title"] for p in plots if not 0 <= p["canvas"]["left"] < p["canvas"]["right"] <= width + 1] == []
    covered = [(a["title"], b["title"]) for i, a in enumerate(plots) for b in plots[i + 1:] if _overlap(a["canvas"], b["canvas"])]
    assert covered == [], covered
