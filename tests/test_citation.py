"""CITATION.cff is a valid Citation File Format 1.2.0 file that names this version and the paper.

The schema is the Citation File Format's own (tests/support/citation-cff-1.2.0.schema.json, from
the citation-file-format project, CC-BY-4.0), checked with jsonschema as its validators check it.
"""

from __future__ import annotations

import json
import tomllib

import jsonschema
import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.quick


def citation() -> dict:
    return yaml.safe_load((REPO / "CITATION.cff").read_text())


def test_the_citation_file_follows_the_schema():
    schema = json.loads((REPO / "tests/support/citation-cff-1.2.0.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(citation()))
    assert not errors, errors


def test_the_schema_refuses_what_is_not_a_citation():
    """The check can fail: a file without its authors, or with a misspelt key, is refused."""
    schema = json.loads((REPO / "tests/support/citation-cff-1.2.0.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
    assert list(validator.iter_errors({k: v for k, v in citation().items() if k != "authors"}))
    assert list(validator.iter_errors(citation() | {"titel": "x"}))


def test_the_citation_names_this_version_and_the_paper():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    cff = citation()
    assert cff["version"] == version
    paper = cff["references"][0]
    assert paper["title"] == "Very Large-Scale Multi-Agent Simulation in AgentScope"
    assert any(i["value"] == "arXiv:2407.17789" for i in paper["identifiers"])
    assert "CITATION.cff" in (REPO / "README.md").read_text()
