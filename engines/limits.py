"""Request and token limits shared by every actor of one engine (hosted APIs' rate limits).

``Limits`` is a pair of token buckets (requests per minute, tokens per minute) that hands out
reservations: a caller learns how long to wait before it may send, and the bucket is debited
at once, so concurrent callers queue up instead of all going when it refills. A server's
``Retry-After`` holds every caller back. On Ray the buckets live in one named actor per
engine config (``tasks.limits``: the workers' side), created by the driver, so all actors of a run
share them; ``Limiter`` finds it by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

#: Seconds of traffic a bucket may send at once: limits are kept per second, not per minute,
#: so a run never bursts a minute's quota and then stalls (servers count over sliding windows).
BURST_S = 1.0


@dataclass
class Bucket:
    """A token bucket of ``per_minute`` units refilled continuously; ``burst`` units at most."""

    per_minute: float
    burst: float = 0.0
    level: float = field(init=False)
    at: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.burst = self.burst or max(1.0, self.per_minute / 60.0 * BURST_S)
        self.level = self.burst

    def reserve(self, units: float, now: float) -> float:
        """Debit ``units`` (the level may go negative: later callers wait longer); return the
        seconds until they are covered."""
        self.level = min(self.burst, self.level + (now - self.at) * self.per_minute / 60.0)
        self.at = now
        self.level -= units  # a request larger than the burst waits for the difference
        return max(0.0, -self.level * 60.0 / self.per_minute)


class Limits:
    """Requests-per-minute and tokens-per-minute limits (either may be None: unlimited).

    ``reserve`` returns the seconds a request must wait; ``settle`` corrects the token
    estimate by what the server reported; ``hold`` keeps everyone back (``Retry-After``).
    """

    def __init__(self, requests_per_minute: float | None = None, tokens_per_minute: float | None = None):
        self.requests = Bucket(requests_per_minute) if requests_per_minute else None
        self.tokens = Bucket(tokens_per_minute) if tokens_per_minute else None
        self.held_until = 0.0

    def reserve(self, tokens: float = 0.0) -> float:
        now = time.monotonic()
        wait = max(0.0, self.held_until - now)
        if self.requests is not None:
            wait = max(wait, self.requests.reserve(1, now))
        if self.tokens is not None and tokens:
            wait = max(wait, self.tokens.reserve(tokens, now))
        return wait

    def settle(self, extra_tokens: float) -> None:
        """The request used ``extra_tokens`` more (or, negative, fewer) than reserved."""
        if self.tokens is not None and extra_tokens:
            self.tokens.level -= extra_tokens

    def hold(self, seconds: float) -> None:
        self.held_until = max(self.held_until, time.monotonic() + seconds)


def actor_name(key: str) -> str:
    """The Ray name of the shared limits of the engine config with this key."""
    return f"keynes-limits-{key}"


class Limiter:
    """What an engine calls before each request: ``await limiter.acquire(tokens)``.

    On Ray (inside an actor or a driver with Ray started) the buckets are the shared named
    actor's; otherwise they are this process's own. ``waited_s`` adds up the seconds spent
    waiting on limits (stored per shard).
    """

    def __init__(self, key: str, requests_per_minute: float | None, tokens_per_minute: float | None):
        self.waited_s = 0.0
        self._remote = None
        self._local = Limits(requests_per_minute, tokens_per_minute)
        import ray

        if ray.is_initialized():
            try:  # the run's shared limits, created by the driver (``tasks.limits.ensure_shared``)
                self._remote = ray.get_actor(actor_name(key))
            except ValueError:  # no pool made them: this engine keeps its own
                pass

    async def acquire(self, tokens: float = 0.0) -> float:
        import asyncio

        wait = await self._remote.reserve.remote(tokens) if self._remote is not None else self._local.reserve(tokens)
        if wait > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)
        return wait

    def settle(self, extra_tokens: float) -> None:
        if self._remote is not None:
            self._remote.settle.remote(extra_tokens)
        else:
            self._local.settle(extra_tokens)

    def hold(self, seconds: float) -> None:
        if self._remote is not None:
            self._remote.hold.remote(seconds)
        else:
            self._local.hold(seconds)
