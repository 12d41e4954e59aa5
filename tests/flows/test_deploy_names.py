"""`keynes serve` of several configs: one deployment each, named after the experiment, made unique
by the config's file name — with nothing in it that Prefect refuses in a deployment's name."""

from __future__ import annotations

import shutil

import pytest

from design.config import NAME_REFUSES, ConfigError
from flows.deploy import deployments_for
from tests.conftest import QUICKSTART

pytestmark = pytest.mark.quick


def test_deployments_of_one_experiment_are_named_by_their_files(tmp_path):
    first, odd, again = tmp_path / "first.yaml", tmp_path / "50%&<more>.yaml", tmp_path / "again" / "first.yaml"
    again.parent.mkdir()
    for path in (first, odd, again):
        shutil.copy(QUICKSTART, path)
    names = [d.name for d in deployments_for([first, odd])]
    assert names == ["quickstart", "quickstart-50---more-"] and not NAME_REFUSES & set(names[1])
    with pytest.raises(ConfigError, match="a deployment named 'quickstart-first' is already served"):
        deployments_for([first, odd, tmp_path / "first.yaml", again])
