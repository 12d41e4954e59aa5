"""The report server (`keynes report --serve`) in real headless Chromium: the index of every
experiment, and an experiment's page that gains a round while it stays open (no reload) and
keeps its looks. Each test that plays a round plays the next one, in any order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from flows.experiment import experiment
from tests.conftest import REPO
from tests.reports.browser import CHROMIUM, Chromium
from tests.support.sql import q
from tests.support.waiting import answers, free_port, wait_for

#: Simulated agents (no LLM is needed to watch pages change); one round per run. Two tests play a
#: round each, so a round is still to play (the experiment is waiting) whatever their order.
LIVE = {
    "name": "live",
    "seed": 9,
    "population": {"spec": "education.yaml", "size": 20},
    "game": {"rounds": 4},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 20},
    "report": {"enabled": False},
    "continue": True,
}
#: What a live update must leave as a fresh load drew it: headings' and the experiment id's looks.
LOOKS = ["font-size", "font-weight", "font-family", "color", "margin-top"]




@pytest.fixture(scope="module")
def served(tmp_path_factory, prefect_api, local_ray):
    """One round of a `continue` experiment, and `keynes report --serve` of its warehouse."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    db = tmp_path_factory.mktemp("served") / "live.duckdb"
    summary = experiment(LIVE, db=str(db))
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cli.app", "report", "--serve", "--db", str(db), "--port", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: server.poll() is not None or answers(base + "/"), 120, "the report server")
        assert server.poll() is None, server.stderr.read()
        yield {"db": db, "base": base, "experiment_id": summary.experiment_id, "server": server}
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_index_lists_every_experiment_with_a_link(served):
    with Chromium(allow=("127.0.0.1",)) as browser:
        browser.open(served["base"] + "/", canvases=0, timeout_s=30)
        text = wait_for(lambda: (t := browser.text()) and served["experiment_id"] in t and t, 30, "the index table")
        href = browser.evaluate(
            "(() => { const found = []; const walk = (n) => { if (n.shadowRoot) walk(n.shadowRoot);"
            " if (n.tagName === 'A') found.push(n.getAttribute('href')); for (const c of n.children || []) walk(c); };"
            " walk(document.documentElement); return found.filter(h => h && h.startsWith('experiment?')); })()")
    # Status, rounds played / planned (the other tests of this module may have played rounds).
    (played,), = q(served["db"], "select count(*) from rounds")
    assert "waiting" in text and re.search(rf"{played} / {LIVE['game']['rounds']}", text)
    assert href == [f"experiment?id={served['experiment_id']}"]


def test_a_running_experiments_page_gains_a_round_without_a_reload(served):
    url = f"{served['base']}/experiment?id={served['experiment_id']}"
    with Chromium(allow=("127.0.0.1",)) as browser:
        load = browser.open(url, canvases=2)
        (played,), = q(served["db"], "select count(*) from rounds")
        assert re.search(rf"rounds played\s+{played}\b", browser.text())
        plots = len([c for c in browser.canvases() if c["inked"]])
        browser.evaluate("window.__not_reloaded = true")
        experiment(LIVE, db=str(served["db"]))  # the next round lands in the warehouse
        wait_for(lambda: (t := browser.text()) and re.search(rf"rounds played\s+{played + 1}\b", t) and t, 60, "the round on the open page")
        assert browser.evaluate("window.__not_reloaded === true")  # the same page, updated in place
        # The round's histogram joins the page: more plots, drawn.
        wait_for(lambda: len([c for c in browser.canvases() if c["inked"]]) > plots, 30, "the round's histogram")
    assert not load.errors, load.errors


def test_a_live_update_keeps_the_looks_of_headings_and_the_experiment_id(served):
    url = f"{served['base']}/experiment?id={served['experiment_id']}"
    with Chromium(allow=("127.0.0.1",)) as browser:

        def looks() -> dict:
            return {(e["tag"], e["text"]): e["style"] for e in browser.styles("h1, h2, h3, h4, code", LOOKS)
                    if e["tag"] != "code" or e["text"] == served["experiment_id"]}

        browser.open(url, canvases=2)
        (played,), = q(served["db"], "select count(*) from rounds")
        wait_for(lambda: re.search(rf"rounds played\s+{played}\b", browser.text()), 30, "the page")
        before = looks()
        experiment(LIVE, db=str(served["db"]))  # the next round lands: the page redraws itself
        wait_for(lambda: re.search(rf"rounds played\s+{played + 1}\b", browser.text()), 60, "the round on the open page")
        time.sleep(2)  # the redrawn panes' stylesheets load
        deadline = time.monotonic() + 10
        while True:
            after = looks()
            changed = {k: (before[k], after[k]) for k in before.keys() & after.keys() if before[k] != after[k]}
            if not changed or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    kept = before.keys() & after.keys()
    assert ("code", served["experiment_id"]) in kept and {("h2", "Overview ¶"), ("h2", "Arms ¶")} <= kept, sorted(kept)
    assert changed == {}, changed
