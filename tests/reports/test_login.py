"""Sharing the report pages beyond this machine takes a login: a real `keynes report --serve`
bound to this machine's outward address with KEYNES_REPORT_PASSWORD, read in real headless
Chromium by a stranger (the login form, nothing of the experiment) and by a reader who logs in
(the experiment's page); and a shared server with neither a login nor --public does not start."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from urllib.parse import urljoin, urlsplit

import psutil
import pytest

from flows.experiment import experiment
from tests.conftest import REPO
from tests.reports.browser import CHROMIUM, Chromium
from tests.support.sql import q
from tests.support.waiting import free_port, wait_for

SHARED = {
    "name": "shared-behind-a-login",
    "seed": 5,
    "population": {"spec": "education.yaml", "size": 20},
    "game": {"rounds": 2},
    "arms": {"engines": [{"kind": "simulated"}], "prompts": ["basic"]},
    "workers": {"actors": 1, "shard_size": 20},
    "report": {"enabled": False},
}
PASSWORD = "correct horse battery staple"


def outward_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback (None: there is none)."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def keynes(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run the CLI (a server that wrongly starts is stopped after 60 s: the test fails)."""
    env = {k: v for k, v in (env or os.environ).items() if k != "KEYNES_REPORT_PASSWORD"}
    try:
        done = subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"keynes {' '.join(args)} served instead of exiting")
    return done.returncode, [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def first_answer(url: str) -> tuple[int, str]:
    """The HTTP status of ``url`` and where it redirects (redirects not followed)."""
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=30) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Location", "")
    except OSError:
        return 0, ""


@pytest.fixture(scope="module")
def shared(tmp_path_factory, prefect_api, local_ray):
    """A played experiment, and `keynes report --serve` of its warehouse on the outward address
    (0.0.0.0 reached through 127.0.0.1 on a machine with loopback only), with a password."""
    if not os.path.exists(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install -y chromium")
    db = tmp_path_factory.mktemp("shared") / "shared.duckdb"
    summary = experiment(SHARED, db=str(db))
    outward = outward_ipv4()
    bind, reach = (outward, outward) if outward else ("0.0.0.0", "127.0.0.1")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cli.app", "report", "--serve", "--db", str(db), "--host", bind, "--port", str(port)],
                              cwd=REPO, env={**os.environ, "KEYNES_REPORT_PASSWORD": PASSWORD},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://{reach}:{port}"
    try:
        wait_for(lambda: server.poll() is not None or first_answer(base + "/")[0] != 0, 120, "the report server")
        assert server.poll() is None, server.stdout.read()
        yield {"db": db, "base": base, "host": reach, "experiment_id": summary.experiment_id, "server": server}
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    assert PASSWORD not in out  # the server never prints the password


def round_numbers(db) -> set[str]:
    """Every number of the experiment's rounds, as a page could show it."""
    shown = set()
    for row in q(db, "select mean, median, std, target, winning_guess from rounds"):
        for value in row:
            if value is not None:
                shown |= {f"{value:.1f}", f"{value:.2f}", f"{value:.3f}"}
    return shown


def page_text(browser: Chromium) -> str:
    """The page's text ("" while a navigation replaces the page)."""
    try:
        return browser.text() or ""
    except RuntimeError:
        return ""


def test_a_stranger_gets_the_login_page_and_nothing_of_the_experiment(shared):
    page = f"{shared['base']}/experiment?id={shared['experiment_id']}"
    for url in (shared["base"] + "/", page):
        status, location = first_answer(url)
        assert status == 302 and urlsplit(urljoin(url, location)).path == "/login", (url, status, location)
    with Chromium(allow=(shared["host"],)) as browser:
        for url in (shared["base"] + "/", page):
            browser.open(url, canvases=0, timeout_s=5)
            assert browser.evaluate("location.pathname") == "/login"
            assert browser.evaluate("!!document.querySelector('input[type=password]')")
            text = page_text(browser)
            assert shared["experiment_id"] not in text and SHARED["name"] not in text and "rounds played" not in text
            assert not re.search(r"\d", text), text  # no number at all, so none of the rounds'
            assert not round_numbers(shared["db"]) & set(re.findall(r"\d+\.\d+", text))


def log_in(browser: Chromium, user: str, password: str) -> None:
    browser.evaluate("(() => { const f = document.querySelector('form');"
                     f" f.username.value = {json.dumps(user)}; f.password.value = {json.dumps(password)};"
                     " f.submit(); return true; })()")


def test_a_wrong_password_stays_on_the_login_page(shared):
    with Chromium(allow=(shared["host"],)) as browser:
        browser.open(shared["base"] + "/", canvases=0, timeout_s=5)
        log_in(browser, "ada", "wrong")
        text = wait_for(lambda: (t := page_text(browser)) and "Invalid" in t and t, 30, "the login error")
    assert shared["experiment_id"] not in text and SHARED["name"] not in text


def test_a_reader_who_logs_in_sees_the_experiments_page(shared):
    page = f"{shared['base']}/experiment?id={shared['experiment_id']}"
    (played,), = q(shared["db"], "select count(*) from rounds")
    with Chromium(allow=(shared["host"],)) as browser:
        browser.open(page, canvases=0, timeout_s=5)
        assert browser.evaluate("location.pathname") == "/login"
        log_in(browser, "ada", PASSWORD)
        text = wait_for(lambda: (t := page_text(browser)) and re.search(rf"rounds played\s+{played}\b", t) and t, 90,
                        "the experiment's page after the login")
        assert shared["experiment_id"] in text and browser.evaluate("location.pathname") == "/experiment"
        # The index too, in the same logged-in browser.
        browser.open(shared["base"] + "/", canvases=0, timeout_s=5)
        wait_for(lambda: shared["experiment_id"] in page_text(browser), 30, "the index")


@pytest.mark.quick
@pytest.mark.parametrize("command", [["report", "--serve", "--db", "{db}", "--host", "0.0.0.0", "--port", "{port}"],
                                     ["serve", str(REPO / "experiments" / "quickstart.yaml"), "--db", "{db}",
                                      "--report-host", "0.0.0.0", "--report-port", "{port}"]], ids=["report", "serve"])
def test_sharing_with_neither_a_login_nor_public_exits_2_with_one_line(command, tmp_path):
    args = [a.format(db=tmp_path / "k.duckdb", port=free_port()) for a in command]
    prefix = "report-" if command[0] == "serve" else ""
    code, lines = keynes(*args)
    assert code == 2 and len(lines) == 1, lines
    assert f"--{prefix}public" in lines[0] and "KEYNES_REPORT_PASSWORD" in lines[0] and f"--{prefix}credentials" in lines[0]
    assert not (tmp_path / "k.duckdb").exists()  # nothing started


@pytest.mark.quick
def test_a_bad_credentials_file_exits_2_naming_it(tmp_path):
    credentials = tmp_path / "users.json"
    credentials.write_text('{"ada": ""}')
    code, lines = keynes("report", "--serve", "--db", str(tmp_path / "k.duckdb"), "--host", "0.0.0.0",
                         "--port", str(free_port()), "--credentials", str(credentials))
    assert code == 2 and len(lines) == 1 and str(credentials) in lines[0], lines
