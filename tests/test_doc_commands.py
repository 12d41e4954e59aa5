"""The documented commands run: every fenced shell block (```bash, ```sh, ```console) of README.md
and docs/*.md whose fence line comes right after the line ``<!-- runnable -->`` (an HTML comment:
invisible on GitHub and in mkdocs) runs as written, with ``bash -e`` in the repository's root, and
exits 0. In a ``console`` block the lines starting with ``$ `` are the commands (a line ending in
a backslash continues on the next); the other lines are output.

Blocks run in reading order (README.md, then the pages in mkdocs.yml's nav order; each file top
to bottom), each once, whatever order the tests run in: a block may read what an earlier one
wrote (the warehouse page queries the simulated run of the config page). Runnable blocks write
only under /tmp/keynes-docs/, which is emptied before the first block runs.

README.md's blocks run where a user runs them after the quickstart: in a folder holding
``experiments/`` and a ``keynes.duckdb`` with the quickstart played by real Gemma 3 270M — the
session's quickstart fixture, whose overrides are the README's one-minute try, so that rerunning
that command resumes a complete experiment (its rows were written by the same config) and the
query and the report read real answers. Only blocks that need no GPU, no long LLM run and no
server that runs until stopped are marked runnable; the others are run by the suite in their
own tests: the install and the README's test commands by ``.ci/run`` (which runs exactly them),
the full quickstart by the quickstart fixture (a third of its agents), ``keynes serve`` by
tests/flows/test_deploy.py. Each runs as a user's shell would: ``keynes`` and ``duckdb`` from
this environment's bin folder, ``UV_NO_SYNC=1`` (a ``uv run`` does not re-sync the environment
and strip its extras), ``UV_PROJECT`` this repository (``uv run`` finds it from another folder),
``KEYNES_CACHE`` as set, no ``PREFECT_API_URL`` or ``RAY_ADDRESS`` (a ``keynes run`` starts its
own temporary Prefect API and Ray, as on a laptop), and a ``PREFECT_HOME`` that holds a migrated
Prefect database, as a user's does after their first run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.test_docs import nav_pages

pytestmark = pytest.mark.slow

MARKER = "<!-- runnable -->"
SHELLS = ("bash", "sh", "console")
SCRATCH = Path("/tmp/keynes-docs")  # where runnable blocks write


@dataclass(frozen=True)
class Block:
    """One runnable block: its file (relative to the repository), the line of its opening fence
    (1-based), its language and the script that runs."""

    file: str
    line: int
    lang: str
    script: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def doc_files() -> list[Path]:
    """README.md, then docs/'s pages in nav order (and any page the nav misses, by name)."""
    pages = [REPO / "docs" / page for page in nav_pages()]
    pages += sorted(set((REPO / "docs").glob("*.md")) - set(pages))
    return [REPO / "README.md", *[page for page in pages if page.exists()]]


def console_commands(lines: list[str]) -> str:
    """The commands of a console block: its ``$ `` lines and their backslash continuations."""
    commands, continuing = [], False
    for line in lines:
        if continuing:
            commands.append(line)
        elif line.startswith("$ "):
            commands.append(line[2:])
        else:
            continue
        continuing = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


def blocks_in(path: Path) -> tuple[list[Block], list[int]]:
    """The runnable blocks of one file, and the lines of markers that sit above no shell block."""
    lines = path.read_text().splitlines()
    found, stray, i = [], [], 0
    while i < len(lines):
        opening = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not opening:
            if lines[i].strip() == MARKER and not (i + 1 < len(lines) and re.match(r"^(`{3,}|~{3,})\s*(bash|sh|console)\s*$", lines[i + 1])):
                stray.append(i + 1)
            i += 1
            continue
        fence, lang = opening.group(1), opening.group(2)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence) and not lines[j].strip().strip(fence[0])), len(lines))
        body = lines[i + 1:end]
        if i > 0 and lines[i - 1].strip() == MARKER and lang in SHELLS:
            script = console_commands(body) if lang == "console" else "\n".join(body) + "\n"
            found.append(Block(str(path.relative_to(REPO)), i + 1, lang, script))
        i = end + 1
    return found, stray


def runnable_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks_in(path)[0]]


BLOCKS = runnable_blocks()


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    from tests.support.prefect_db import seed_home

    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "RAY_ADDRESS")}
    env.update(UV_NO_SYNC="1", UV_PROJECT=str(REPO), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PREFECT_HOME=str(seed_home(tmp_path_factory.mktemp("docs-prefect"), tmp_path_factory)))
    return env


def readme_folder(quickstart_db: Path) -> Path:
    """Where README.md's blocks run: ``experiments/`` and the quickstart's ``keynes.duckdb``."""
    folder = SCRATCH / "readme"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "experiments").symlink_to(REPO / "experiments", target_is_directory=True)
    shutil.copy(quickstart_db, folder / "keynes.duckdb")
    return folder


@pytest.fixture(scope="module")
def run_block(shell_env, request):
    """Runs a block, after every earlier block that has not run yet, each once: returns its
    (exit status, output, seconds)."""
    shutil.rmtree(SCRATCH, ignore_errors=True)
    done: dict[Block, tuple[int, str, float]] = {}
    folders: dict[str, Path] = {}

    def folder_of(block: Block) -> Path:
        if block.file != "README.md":
            return REPO
        if "readme" not in folders:
            folders["readme"] = readme_folder(request.getfixturevalue("quickstart")[0])
        return folders["readme"]

    def run(block: Block) -> tuple[int, str, float]:
        for earlier in BLOCKS[:BLOCKS.index(block) + 1]:
            if earlier not in done:
                started = time.monotonic()
                result = subprocess.run(["bash", "-e", "-c", earlier.script], cwd=folder_of(earlier), env=shell_env,
                                        capture_output=True, text=True, timeout=600)
                done[earlier] = (result.returncode, result.stdout + result.stderr, time.monotonic() - started)
        return done[block]

    yield run
    shutil.rmtree(SCRATCH, ignore_errors=True)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_a_runnable_block_runs_as_written(block, run_block):
    status, output, seconds = run_block(block)
    assert status == 0, f"{block.id} ({block.lang}) exited {status} after {seconds:.1f} s:\n{block.script}\n--- output ---\n{output[-6000:]}"


def test_runnable_blocks_are_found_and_every_marker_sits_above_a_shell_block():
    stray = {str(path.relative_to(REPO)): lines for path in doc_files() if (lines := blocks_in(path)[1])}
    assert not stray, f"{MARKER} lines not directly above a ```bash, ```sh or ```console fence: {stray}"
    assert len(BLOCKS) >= 4, [block.id for block in BLOCKS]


def test_the_readmes_try_is_the_session_quickstart():
    """The README's run block sets the quickstart fixture's overrides: it resumes the fixture's
    complete experiment instead of playing a second one in the suite."""
    from tests.conftest import QUICKSTART_OVERRIDES

    runs = [block for block in BLOCKS if block.file == "README.md" and "keynes run experiments/quickstart.yaml" in block.script]
    assert runs, "README.md has no runnable quickstart run"
    for block in runs:
        assert sorted(re.findall(r"--set (\S+)", block.script)) == sorted(QUICKSTART_OVERRIDES), block.script


def test_a_console_block_runs_its_dollar_lines_only():
    lines = ["$ keynes run a.yaml \\", "  --set x=1", "error: x", "$ echo done", "done"]
    assert console_commands(lines) == "keynes run a.yaml \\\n  --set x=1\necho done\n"
