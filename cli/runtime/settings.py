"""The settings every keynes process gives Prefect and Ray before either is imported.

Both read their settings at import, and every process keynes starts (Ray's workers, the flow
runs of ``keynes serve``) inherits them. ``apply`` only sets what the environment leaves unset,
so a user's own value always wins. The CLI, the benchmarks and the test suite call it first.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULTS", "apply"]

DEFAULTS: dict[str, str] = {
    # keynes prints its own progress; Prefect's INFO lines would bury it.
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Without PREFECT_API_URL keynes run starts Prefect's temporary API (4–8 s here). Prefect
    # gives it 20 s, which a busy laptop can miss; a run that waits longer loses nothing.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    # Under `uv run`, Ray would start its workers with `uv run` in a copy of the project: a fresh
    # environment without the installed extras (llama.cpp, vLLM). Workers use this interpreter
    # instead; RAY_ENABLE_UV_RUN_RUNTIME_ENV=1 gets Ray's behaviour back.
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    # A local Ray on this machine only: on Linux Ray gives its node the machine's outward address
    # (even for ray.init(_node_ip_address="127.0.0.1")) and its servers listen on every interface.
    # "0" is Ray's macOS/Windows behaviour: node address 127.0.0.1, so the GCS, raylet, object
    # manager, agents, metrics and workers all listen on loopback. Joining a cluster
    # (workers.ray_address) takes the node's address from the cluster and is not affected.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def apply(extra: dict[str, str] | None = None) -> None:
    """Set each of ``DEFAULTS`` (and ``extra``) that the environment does not set already."""
    for name, value in {**DEFAULTS, **(extra or {})}.items():
        os.environ.setdefault(name, value)
