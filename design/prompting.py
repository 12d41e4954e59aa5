"""Each arm's prompt format, checked before anything starts.

Apart from the flow's module so that ``keynes run`` checks it (and prints its header) before it
imports Prefect and Ray.
"""

from __future__ import annotations

from design.arms import Arm
from design.config import ConfigError, ExperimentConfig
from engines import Prompting


def check_prompting(cfg: ExperimentConfig, arms: list[Arm]) -> dict[str, Prompting]:
    """Each arm's prompt format, resolved before anything runs (see ``EngineSpec.prompting``), and
    what its engine's server cannot give (``EngineSpec.check_server``).

    Raises:
        ConfigError: one line naming the engine, e.g. ``chat`` for a GGUF without a template, or
            a vLLM server started without raw logits for exact answers.
    """
    from engines.models import ModelError

    out: dict[str, Prompting] = {}
    for arm in arms:
        try:
            out[arm.run_id] = arm.engine.prompting()
            arm.engine.check_server()
        except (ModelError, OSError, ValueError) as exc:  # also a path that is no model file, or too long a name
            raise ConfigError(f"arms.engines.{engine_index(cfg, arm)}: {getattr(exc, 'strerror', None) or exc}") from None
    return out


def engine_index(cfg: ExperimentConfig, arm: Arm) -> int:
    """The position of the arm's engine in ``arms.engines`` (for error paths)."""
    return next((i for i, e in enumerate(cfg.arms.engines) if e == arm.engine), 0)
