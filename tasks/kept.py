"""Worker pools kept warm in a warm stack's Ray (``keynes up``), their model loaded, between commands.

A command that joined the stack (cli/runtime/stack.py) turns keeping on (``enable``): its pools'
actors are then detached and named after their engine spec (``name``), so the next command with the
same engine spec and actor count finds them (``get_if_exists``) instead of starting processes and
loading a model again. At most one engine's pool is kept: before a pool starts, the kept pools of
other specs that this command does not use are killed (``evict``), so a stack holds the memory and
CPUs of one engine at most, as a run does. ``keynes down`` ends them with the rest of the stack.

A kept actor keeps the environment its command handed it (``KEYNES_CACHE``, an API key, ...): it
is found only by a command with the same engine spec, actor count and environment.

One command at a time uses the kept pools: the first pool a command starts takes a lease (a lock
file beside the stack's record, released when the command exits), and a second command waits for
it. Engines with shared rate limits (a hosted API's) are never kept: their limits belong to a run.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import time
from pathlib import Path
from typing import Any, Callable

__all__ = ["PREFIX", "enable", "enabled", "evict", "keeps", "lease", "name"]

log = logging.getLogger(__name__)

#: The names of kept actors start with it (then the spec's digest, the pool's size, the actor's index).
PREFIX = "keynes-kept-"

#: Variables of a shell that say nothing to an engine (where the command was typed, the terminal).
SHELL = frozenset({"PWD", "OLDPWD", "_", "SHLVL", "COLUMNS", "LINES", "TERM", "TERM_PROGRAM", "TERM_PROGRAM_VERSION", "TERM_SESSION_ID"})

_STATE: dict[str, Any] = {}


def enable(lock: Path, say: Callable[[str], None], environment: dict[str, str]) -> None:
    """Keep this command's pools in the stack; ``lock`` is the stack's lease file, ``say`` prints a
    line, ``environment`` is what the command hands its actors (a kept actor keeps the one it was
    started with, so only a command with the same finds it)."""
    settled = sorted((k, v) for k, v in environment.items() if k not in SHELL and not k.startswith("SSH_"))
    _STATE.update(lock=lock, say=say, held=None, environment=hashlib.sha256(repr(settled).encode()).hexdigest())


def enabled() -> bool:
    return "lock" in _STATE


def keeps(spec: Any) -> bool:
    """Whether a pool of ``spec`` is kept (keeping is on, and the engine has no shared rate limits)."""
    return enabled() and spec.rate_limits() == (None, None)


def name(spec: Any, actors: int, index: int) -> str:
    """The kept actor ``index`` of the pool of ``actors`` actors of ``spec`` (and this command's environment)."""
    return f"{PREFIX}{hashlib.sha256((spec.key + _STATE['environment']).encode()).hexdigest()[:16]}-{actors}-{index}"


def lease() -> None:
    """Hold the stack's lease for the rest of this command, waiting for another command that holds it."""
    if _STATE.get("held") is not None:
        return
    path: Path = _STATE["lock"]
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _STATE["say"]("another command uses the warm stack's actors; waiting for it to finish")
        start = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        _STATE["say"](f"the warm stack's actors are free (waited {time.monotonic() - start:.0f} s)")
    _STATE["held"] = handle  # kept open: the lock goes with the process


def evict(keep: set[str]) -> None:
    """Kill the kept actors whose names are not in ``keep`` (another engine's, or another size's)."""
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(PREFIX) and actor["name"] not in keep:
            try:
                ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]))
            except ValueError:  # gone meanwhile
                continue
            log.debug("evicted the kept actor %s", actor["name"])
