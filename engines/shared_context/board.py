"""One answer distribution per distinct prompt per pool: the actors of an engine share them.

Each actor of a pool keeps the distributions it computed (``engines.shared_context.SharedContextAnswers``), but
two actors given shards with the same prompts (every shard of round 1: a few persona groups)
would each compute them. An ``AnswerBoard`` is where a pool's engines claim a prompt before
computing it and publish its distribution after; ``Claims`` is one batch's view of it:

- ``take(order)``: the next prompt of the batch (in the engine's own order) that no engine
  has claimed, now claimed by this one; None when the others hold the rest. An engine that
  claims one prompt at a time, as a stream frees up, shares the work with its peers: the
  second actor starts at the middle of the sorted prompts (``start``), so they meet late.
- ``publish(i, found)``: prompt ``i``'s distribution, for the others.
- ``others(timeout)``: the distributions of the prompts another engine claimed, once they are
  published. A claim whose owner died is taken up again by its restarted actor (Ray plays its
  shard again); a board whose actor restarted holds no claims, and a waiter computes what nobody
  claims itself, at once; after ``timeout`` seconds it computes whatever is still missing. A
  board that fails (its actor gone) is dropped: the batch is computed here, as without a board.

A distribution is a function of its prompt and sampling settings only (the key says both), and
every engine of a pool runs the same model with the same settings, so which engine computes
it changes no bit (tests/flows/test_shared_context.py compares pools of one and two actors).
This module is plain Python: ``tasks.actor`` hosts a board in a pool's first actor.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

#: How long an engine waits for a distribution another engine claimed before computing it
#: itself (its owner may have died): a prompt's walk takes well under a second on Gemma 3 270M.
WAIT_S = 120.0

#: Distributions a board keeps (the oldest go first; a later claim of one computes it again).
KEEP = 200_000


class Board(Protocol):
    """Where a pool's engines claim prompts and publish their distributions."""

    def claim(self, owner: int, key: str) -> bool: ...

    def publish(self, key: str, found: Any) -> None: ...

    def wait(self, keys: list[str], timeout: float) -> dict[str, Any]: ...


class AnswerBoard:
    """A pool's board, in memory (thread-safe: an actor serves it beside its own work).

    ``claim`` grants a key to the first owner that asks (again to the same owner, which may be
    a restarted actor playing its shard again) until it is published; a published key is never
    granted again.
    """

    def __init__(self, keep: int = KEEP):
        self.keep = keep
        self._owner: dict[str, int] = {}
        self._found: dict[str, Any] = {}
        self._changed = threading.Condition()

    def claim(self, owner: int, key: str) -> bool:
        with self._changed:
            if key in self._found:
                return False
            return self._owner.setdefault(key, owner) == owner

    def publish(self, key: str, found: Any) -> None:
        with self._changed:
            self._found[key] = found
            self._owner.pop(key, None)
            while len(self._found) > self.keep:
                self._found.pop(next(iter(self._found)))
            self._changed.notify_all()

    def wait(self, keys: list[str], timeout: float) -> dict[str, Any]:
        """The published distributions of ``keys``, once each is published or claimed by no one
        (a board that started again, its actor restarted, holds none of the claims made before:
        the waiter computes those itself), or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                missing = [k for k in keys if k not in self._found and k in self._owner]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return {k: self._found[k] for k in keys if k in self._found}
                self._changed.wait(left)


class Claims:
    """One batch's claims on its pool's board: ``keys[i]`` names the batch's prompt ``i``."""

    def __init__(self, board: Board, owner: int, keys: list[str], start: float = 0.0, wait_s: float = WAIT_S):
        self.board: Board | None = board
        self.owner = owner
        self.keys = keys
        #: Where in its sorted prompts this engine starts (0 ≤ start < 1): its rank in the pool
        #: over the pool's size, so that peers begin far apart.
        self.start = start
        self.wait_s = wait_s
        self.mine: set[int] = set()

    def order(self, ranked: list[int]) -> list[int]:
        """``ranked`` (the batch's prompts in the engine's order), begun at ``start``."""
        cut = int(self.start * len(ranked))
        return ranked[cut:] + ranked[:cut]

    def take(self, queue: list[int]) -> int | None:
        """Pop and return the first of ``queue`` that this engine now owns; None (and ``queue``
        emptied) when every prompt left is another engine's."""
        while queue:
            i = queue.pop(0)
            if self._claim(i):
                self.mine.add(i)
                return i
        return None

    def publish(self, i: int, found: Any) -> None:
        if self.board is not None:
            try:
                self.board.publish(self.keys[i], found)
            except Exception:  # noqa: BLE001 - a board that fails is dropped (see the module)
                self.board = None

    def others(self) -> dict[int, Any]:
        """The prompts other engines claimed: their distributions, as published within
        ``wait_s`` seconds (what is missing then is this engine's to compute)."""
        theirs = [i for i in range(len(self.keys)) if i not in self.mine]
        if not theirs or self.board is None:
            return {}
        try:
            found = self.board.wait([self.keys[i] for i in theirs], self.wait_s)
        except Exception:  # noqa: BLE001
            self.board = None
            return {}
        return {i: found[self.keys[i]] for i in theirs if self.keys[i] in found}

    def _claim(self, i: int) -> bool:
        if self.board is None:
            return True
        try:
            return self.board.claim(self.owner, self.keys[i])
        except Exception:  # noqa: BLE001
            self.board = None
            return True
