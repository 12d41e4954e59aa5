"""docs/query.md runs as written: its Python blocks (and README.md's ``import keynes`` block) in a
folder holding a ``keynes.duckdb``, its DuckDB shell commands with the shell the dev dependencies
install, and the SQL of its R example through ``keynes.query``: R is not installed here, so what the
suite checks of that example is that each query it sends reads the warehouse. The page's statement
of which DuckDB versions read the file is checked against a file keynes creates.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
from pathlib import Path

import duckdb
import pytest

import keynes
from tests.conftest import REPO
from warehouse.files import STORAGE_COMPATIBILITY, WarehouseFile
from warehouse.schema import SCHEMA_VERSION

PAGE = REPO / "docs" / "query.md"


def blocks(path: Path, lang: str) -> list[str]:
    """The fenced blocks of one language in a Markdown file, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```$", path.read_text(), re.MULTILINE | re.DOTALL)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, filled) -> Path:
    """Where a reader runs the page's examples: a folder with a warehouse named ``keynes.duckdb``."""
    folder = tmp_path_factory.mktemp("page")
    shutil.copy(filled, folder / "keynes.duckdb")
    return folder


def run(command: list[str], folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), PATH=f"{Path(sysconfig.get_path('scripts'))}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


PYTHON = [(f"docs/query.md python {i + 1}", code) for i, code in enumerate(blocks(PAGE, "python"))]
PYTHON += [(f"README.md python {i + 1}", code) for i, code in enumerate(blocks(REPO / "README.md", "python")) if "import keynes" in code]


@pytest.mark.parametrize("code", [code for _, code in PYTHON], ids=[name for name, _ in PYTHON])
def test_a_python_block_runs_as_written(code, folder):
    result = run([sys.executable, "-c", code], folder)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "shape: (" in result.stdout or "mean" in result.stdout, result.stdout  # it printed a result


def test_the_page_has_the_examples_it_promises():
    names = [name for name, _ in PYTHON]
    assert sum(n.startswith("docs/") for n in names) >= 4 and any(n.startswith("README") for n in names), names
    assert len(blocks(PAGE, "r")) == 1 and blocks(PAGE, "bash")


def test_the_duckdb_shell_commands_run(folder):
    commands = [line for block in blocks(PAGE, "bash") for line in block.splitlines() if line.startswith("duckdb ")]
    assert len(commands) == 3, commands
    result = run(["bash", "-e", "-c", "\n".join(commands)], folder)
    assert result.returncode == 0, result.stderr
    assert "round" in result.stdout and "v1.4.0+" in result.stdout, result.stdout
    assert (folder / "histogram.csv").read_text().startswith("experiment_id,run_id,arm,round,bin_low,bin_high,n\n")


def test_the_r_example_reads_the_warehouse_and_releases_it(folder):
    """Each query of the R example (``keynes_query("…")``) runs on the warehouse and returns rows; the
    example opens the file read-only and disconnects with ``shutdown = TRUE`` after each query."""
    (code,) = blocks(PAGE, "r")
    assert 'read_only = TRUE' in code and "on.exit(dbDisconnect(con, shutdown = TRUE))" in code
    queries = re.findall(r'keynes_query\("([^"]+)"\)', code)
    assert len(queries) == 2, queries
    for sql in queries:
        assert keynes.query(sql, db=folder / "keynes.duckdb").height > 0, sql


def test_the_storage_format_stated_is_the_one_keynes_writes(tmp_path):
    """The page names the storage format, its number in the header and its tag; a new warehouse has them."""
    text = " ".join(PAGE.read_text().split())
    version = re.search(r"DuckDB's v([\d.]+) storage format", text).group(1)
    number = int(re.search(r"storage version (\d+) in the file's header", text).group(1))
    assert f"**DuckDB {version} and every later release**" in text
    assert STORAGE_COMPATIBILITY == f"v{version}"
    path = tmp_path / "new.duckdb"
    with WarehouseFile(path).connect():
        pass
    with path.open("rb") as fh:
        magic, header_number = struct.unpack("<8x4sQ", fh.read(20))
    assert (magic, header_number) == (b"DUCK", number)
    with duckdb.connect(str(path), read_only=True) as con:
        (tags,) = con.execute("select tags from duckdb_databases() where database_name = current_database()").fetchone()
    assert tags["storage_version"] == f"v{version}+" and f"storage_version: v{version}+" in text
    # The shell of the dev dependencies (another DuckDB release) reads it.
    shell = Path(sysconfig.get_path("scripts")) / "duckdb"
    shown = subprocess.run([str(shell), "-readonly", "-csv", str(path), "-c", "select max(version) from schema_version"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.splitlines()[-1] == str(SCHEMA_VERSION), shown.stderr
