"""A report page shows what it was given as text, in real headless Chromium: model names, prompt
modes, experiment names and configs come from whoever wrote a config (or a Custom run's overrides
in the Prefect UI), and a shared report server shows them to everyone who logs in. Markup in them
must never become the page's own: no element, no script, no escape from the config's code block."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import duckdb
import pytest

from core.game import GameRule
from tests.conftest import REPO
from tests.reports.browser import CHROMIUM, Chromium
from tests.warehouse.conftest import EXPERIMENT, ROUNDS, fill

IMG = '<img src="x" onerror="window.injected = (window.injected || 0) + 1">'
MODEL = f"fixture/{IMG}"
MODE = "<b>mode</b>"
NAME = "views <i>of an older warehouse</i>"  # a config's name may not hold such characters; a warehouse an older keynes wrote may
CONFIG = {"name": "views", "note": f"```\n{IMG}\n```", "arms": {"engines": [{"kind": "openai", "model": MODEL}]}}


def test_markup_in_labels_names_and_configs_is_shown_as_text(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    path = tmp_path / "untrusted.duckdb"
    fill(path, arms=[(0, MODE, MODEL, GameRule(ratio="2/3", rounds=ROUNDS)), (1, "basic", "fixture/a", GameRule(ratio="2/3", rounds=ROUNDS))])
    with duckdb.connect(str(path)) as con:
        con.execute("update experiments set config = ?, name = ? where experiment_id = ?", [json.dumps(CONFIG), NAME, EXPERIMENT])
    out = tmp_path / "page.html"
    result = subprocess.run([sys.executable, "-m", "cli.app", "report", "--db", str(path), "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    figures = len(re.findall(r'"name":"Figure"', out.read_text(encoding="utf-8")))
    with Chromium() as browser:
        load = browser.open(out.as_uri(), canvases=figures)
        injected, text = browser.evaluate("window.injected || 0"), browser.text()
    assert load.errors == [], load.errors
    assert injected == 0  # no <img> of theirs ever loaded (its onerror would have counted)
    # ... and what they wrote is on the page, as they wrote it: the arm's heading, the one-model
    # line, the config's code block, the page's title
    assert text.count(IMG) >= 3 and MODE in text and NAME in text, [line for line in text.split("  ") if "img" in line][:5]
