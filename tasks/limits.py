"""A hosted API's request and token limits on Ray: one named actor per engine config, for all its actors.

The driver creates it (``ensure_shared``) before an engine's actors start, so the limits belong to
the run; each engine's ``engines.limits.Limiter`` finds it by name.
"""

from __future__ import annotations

from typing import Any

from engines import EngineSpec
from engines.limits import Limits, actor_name


def _remote_class() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=-1)
    class SharedLimits(Limits):
        """``Limits`` in a Ray actor: one per engine config, for all of its actors."""

    return SharedLimits


#: The Ray actor class, made once per process on first use (``ray.remote`` here would import Ray with this module).
_REMOTE: list[Any] = []
#: Handles the driver keeps, so each shared actor lives as long as the run.
_HELD: dict[str, Any] = {}


def shared(key: str, requests_per_minute: float | None, tokens_per_minute: float | None) -> Any:
    """The named actor that holds these limits on the Ray cluster (created on first call)."""
    if not _REMOTE:
        _REMOTE.append(_remote_class())
    return _REMOTE[0].options(name=actor_name(key), get_if_exists=True).remote(requests_per_minute, tokens_per_minute)


def ensure_shared(spec: EngineSpec) -> None:
    """In the driver, before an engine's actors start: create its shared limits (if it has
    any), so they belong to the run, not to whichever actor asks first."""
    rpm, tpm = spec.rate_limits()
    if (rpm or tpm) and spec.key not in _HELD:
        _HELD[spec.key] = shared(spec.key, rpm, tpm)
