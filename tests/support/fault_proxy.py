"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real OpenAI-compatible server.

Request by request, a schedule decides what happens: pass it through, answer HTTP 429 or
500 itself, never answer (the client's timeout fires, however fast the server is), delay it,
reset the connection, or pass it through and rewrite the model's answer into given
(malformed) text. It is benchmarks/proxy.py's counting proxy answering so: every request is recorded
(``events``: path, action, status, the answer's token usage), so with the schedule "pass" throughout
it counts what a client sends.
Run alone: ``python -m tests.support.fault_proxy UPSTREAM_PORT PORT 429 pass reset ...``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import sys
import threading
from typing import Callable

from benchmarks.proxy import CountingProxy, Event, respond

#: What a schedule may say: "pass", "429", "500" (any 4xx/5xx), "retry-after:SECONDS" (a 429 with that
#: Retry-After header), "stall" (hold the request, unanswered and never sent upstream, until the client
#: closes the connection), "delay:SECONDS" (wait, then pass it through), "reset", "rewrite:TEXT" (every
#: choice's answer), "rewrite-first:TEXT" (the first choice's only).
Action = str
Schedule = Callable[[int, dict], Action]


def cycle(*actions: Action) -> Schedule:
    """Repeat ``actions`` in order over the requests the proxy sees."""
    ring = list(actions)
    return lambda n, body: ring[n % len(ring)]


def first(*actions: Action, then: Action = "pass") -> Schedule:
    """``actions`` for the first requests, then ``then`` for every later one."""
    ring = list(actions)
    return lambda n, body: ring[n] if n < len(ring) else then


class FaultProxy(CountingProxy):
    """The proxy, serving on its own thread and event loop (``with FaultProxy(...) as p``).

    Args:
        upstream_port: the real server's port on 127.0.0.1.
        schedule: request number (from 0) and JSON body → action, for completions (every other
            request passes).
        port: where to listen (0 = any free port; see ``base_url``).
    """

    def __init__(self, upstream_port: int, schedule: Schedule = cycle("pass"), port: int = 0, upstream_host: str = "127.0.0.1"):
        super().__init__(upstream_port, port, upstream_host)
        self.schedule = schedule

    def count(self, action_prefix: str) -> int:
        """How many requests got an action starting with ``action_prefix``."""
        return sum(e.action.startswith(action_prefix) for e in self.events)

    def _action(self, n: int, path: str, body: dict) -> Action:
        return self.schedule(n, body) if path.endswith("completions") else "pass"

    async def _answer(self, event: Event, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                      headers: dict[str, str], body: bytes) -> bool:
        action = event.action
        if action == "reset":
            _reset(writer)
            return False
        if action.isdigit():
            event.status = int(action)
            message = {"error": {"message": f"injected HTTP {action}", "type": "injected", "code": int(action)}}
            await respond(writer, int(action), json.dumps(message).encode())
            return True
        if action.startswith("retry-after:"):
            event.status = 429
            message = {"error": {"message": "injected rate limit", "type": "rate_limit", "code": 429}}
            await respond(writer, 429, json.dumps(message).encode(), {"Retry-After": action.split(":", 1)[1]})
            return True
        if action == "stall":
            await reader.read()  # until the client gives up and closes (EOF or reset)
            return False
        if action.startswith("delay:"):
            await asyncio.sleep(float(action.split(":", 1)[1]))
        if action.startswith(("rewrite:", "rewrite-first:")):
            text, only_first = action.split(":", 1)[1], action.startswith("rewrite-first:")
            return await self._pass(event, writer, method, headers, body, lambda response: _rewrite(response, text, only_first))
        return await self._pass(event, writer, method, headers, body)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed server or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _rewrite(response: bytes, text: str, only_first: bool = False) -> bytes:
    """Replace the answer of every choice (completions and chat), or of the first one (by index), with ``text``."""
    data = json.loads(response)
    choices = sorted(data.get("choices") or [], key=lambda c: c.get("index") or 0)
    for choice in choices[:1] if only_first else choices:
        if "message" in choice:
            choice["message"]["content"] = text
        else:
            choice["text"] = text
    return json.dumps(data).encode()


if __name__ == "__main__":
    upstream, port, *actions = sys.argv[1:]
    proxy = FaultProxy(int(upstream), cycle(*(actions or ["pass"])), int(port)).start()
    print(f"fault proxy on {proxy.base_url} → 127.0.0.1:{upstream}: {' '.join(actions or ['pass'])}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        proxy.stop()
