"""One migrated Prefect database per test session, copied wherever a Prefect API starts.

A Prefect API on a new SQLite file first runs every schema migration: ~25 s of CPU here, paid
by each temporary API a test starts (the session's, and every ``keynes run`` given a
``PREFECT_HOME`` of its own). A user pays it once, on their first run; later runs start on the
migrated ``$PREFECT_HOME/prefect.db``. Tests start theirs the same way: ``seed_home`` puts a
copy of the session's migrated database (``prefect server database upgrade``, once for all
pytest-xdist workers) where Prefect looks for it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NAME = "prefect.db"  # what Prefect opens by default: sqlite:///$PREFECT_HOME/prefect.db


def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's migrated database (made by the first worker that asks; the others wait)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of one session
    home = root / "prefect-migrated"
    home.mkdir(exist_ok=True)
    with open(root / "prefect-migrated.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / NAME).exists():
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env.update(PREFECT_HOME=str(home / "building"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
            result = subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                                    env=env, capture_output=True, text=True, timeout=600)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
            (home / "building" / NAME).rename(home / NAME)
    return home / NAME


def seed_home(home: Path, tmp_path_factory: pytest.TempPathFactory, name: str = NAME) -> Path:
    """``home`` (made if missing) holding a copy of the migrated database as ``name``; returns ``home``."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(migrated(tmp_path_factory), home / name)
    return home
