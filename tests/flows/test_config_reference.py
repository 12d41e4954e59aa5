"""``keynes config``: every config field, then every engine kind's fields, with their
descriptions and defaults (as a user reads them in a terminal)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.quick


@pytest.fixture(scope="module")
def printed() -> str:
    env = dict(os.environ, COLUMNS="400")  # one field per line
    result = subprocess.run([sys.executable, "-m", "cli.app", "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_llamacpp_engines_exact_path_settings_are_listed(printed):
    section = printed.split("kind: llamacpp", 1)[1].split("kind: ", 1)[0]
    for field, default in (("shared_context", "True"), ("sequences", "8"), ("prompt_format", "None"), ("model", "'gemma-3-270m'")):
        line = re.search(rf"^llamacpp\.{field}: (.+)$", section, re.MULTILINE)
        assert line and len(line.group(1)) > 30 and line.group(1).endswith(f"(default: {default})"), (field, section)


def test_every_field_of_every_engine_kind_is_listed_with_a_description(printed):
    import engines
    from engines.mixture import MixtureComponent

    for kind in engines.available():
        for name, field in engines.spec_class(kind).model_fields.items():
            if name == "kind":
                continue
            assert field.description, f"{kind}.{name} has no description"
            assert f"{kind}.{name}: {field.description}" in printed, f"{kind}.{name}"
    for name, field in MixtureComponent.model_fields.items():
        assert f"mixture.components.N.{name}: {field.description}" in printed
    assert "kind: None" not in printed and ": None (default" not in printed  # no field without a description
