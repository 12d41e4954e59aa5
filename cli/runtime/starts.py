"""How long a ``keynes run`` took to start on this machine, for ``keynes plan``'s estimate.

A run's start is its wall less the seconds of the rounds it played (``rounds.seconds``, carried in the flow's summary): the
command's own start, Ray's and Prefect's API's (nothing when it joins a running Ray, a warm stack
or a cluster), the actors and their models, the flow's bookkeeping and its end. ``keynes run``
records the latest for each way of starting (``cold``: its own Ray; ``warm``: a warm stack;
``cluster``: ``workers.ray_address``) and engine; ``keynes plan`` adds it to its estimate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli.runtime.processes import cache_root


def starts_path() -> Path:
    """``$KEYNES_CACHE/starts.json`` (or ``~/.cache/keynes/starts.json``)."""
    return cache_root() / "starts.json"


def way(ray_address: str | None, stack: object | None) -> str:
    """How a run starts: on a cluster (``workers.ray_address``), joined to a warm stack, or cold."""
    return "cluster" if ray_address else "warm" if stack is not None else "cold"


def engine_label(cfg) -> str:
    """The engine a run's start is recorded under: its first arm's ``kind:model``."""
    engine = cfg.arms_list()[0].engine
    return f"{engine.kind}:{engine.model_name}"


def key(way: str, engine: str) -> str:
    """The record of one way of starting (cold, warm, cluster) with one engine (``kind:model``)."""
    return f"{way}|{engine}"


def recorded(way: str, engine: str) -> float | None:
    """The latest start recorded for this way and engine, or None."""
    try:
        value = json.loads(starts_path().read_text()).get(key(way, engine))
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def record(way: str, engine: str, seconds: float) -> None:
    """Keep ``seconds`` as this way's and engine's start (written whole: a reader never sees half)."""
    path = starts_path()
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known[key(way, engine)] = round(seconds, 2)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(known, indent=1, sort_keys=True))
        partial.replace(path)
    except OSError:  # a read-only cache: the plan goes without it
        pass
