"""One filled warehouse for the reader's tests (tests/warehouse/conftest.py: three arms × three
rounds × 400 personas through the real store); tests that write copy it first."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.warehouse.conftest import fill


@pytest.fixture(scope="session")
def filled(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("filled") / "keynes.duckdb"
    fill(path)
    return path
