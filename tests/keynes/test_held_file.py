"""Why ``keynes.connect`` exists: a plain DuckDB connection left open in another process (a
notebook's ``duckdb.connect``) holds up keynes' writer until its lock timeout, and a process that
queries through ``keynes.connect`` over and over does not. Real processes on a real file.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import keynes
from tests.conftest import REPO
from warehouse.files import WarehouseFile


@pytest.fixture
def db(filled):
    return filled


def test_an_open_duckdb_connection_blocks_the_writer_and_keynes_readers_do_not(db, tmp_path):
    """What ``keynes.connect`` is for: a plain connection left open in another process (a notebook's
    ``duckdb.connect``) makes keynes' writer wait its lock timeout and fail; a process that queries
    through ``keynes.connect`` over and over leaves every commit through."""
    path = tmp_path / "shared.duckdb"
    path.write_bytes(db.read_bytes())
    holder = subprocess.Popen([sys.executable, "-c", f"import duckdb, sys; con = duckdb.connect({str(path)!r}, read_only=True); "
                               "print('open', flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        started = time.monotonic()
        with pytest.raises(keynes.WarehouseError, match=r"held by another process for over 1 s"):
            with WarehouseFile(path, lock_timeout_s=1).transaction():
                pass
        assert time.monotonic() - started >= 1
    finally:
        holder.communicate("", timeout=30)

    loop = f"import keynes\nresults = keynes.connect({str(path)!r})\nprint('querying', flush=True)\nwhile True:\n    results.query('select count(*) from guesses')\n"
    reader = subprocess.Popen([sys.executable, "-c", loop], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "querying"
        for i in range(10):
            with WarehouseFile(path, lock_timeout_s=10).transaction() as con:
                con.execute(f"create table note_{i} (x int)")
        assert reader.poll() is None  # still querying after the 10 commits
    finally:
        reader.kill()
        reader.wait()
