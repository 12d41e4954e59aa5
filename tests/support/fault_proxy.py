"""A fault-injecting HTTP proxy on 127.0.0.1 in front of a real OpenAI-compatible server.

Request by request, a schedule decides what happens: pass it through, answer HTTP 429 or
500 itself, never answer (the client's timeout fires, however fast the server is), delay it,
reset the connection, or pass it through and rewrite the model's answer into given
(malformed) text. Every request is recorded (``events``: path, status, the answer's token usage), so
with the schedule "pass" throughout it counts what a client sends. Plain asyncio streams, no framework.
Run alone: ``python -m tests.support.fault_proxy UPSTREAM_PORT PORT 429 pass reset ...``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

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


@dataclass
class Event:
    """One request the proxy handled: its number, path, the action and what the client got."""

    n: int
    path: str
    action: Action
    status: int | None  # the HTTP status sent to the client; None for a reset or a client that left
    body: dict = field(repr=False, default_factory=dict)
    at: float = 0.0  # time.monotonic() when the request arrived
    usage: dict = field(default_factory=dict)  # the answer's OpenAI ``usage`` (prompt_tokens, completion_tokens), if any


class FaultProxy:
    """The proxy, serving on its own thread and event loop (``with FaultProxy(...) as p``).

    Args:
        upstream_port: the real server's port on 127.0.0.1.
        schedule: request number (from 0) and JSON body → action.
        port: where to listen (0 = any free port; see ``base_url``).
    """

    def __init__(self, upstream_port: int, schedule: Schedule = cycle("pass"), port: int = 0, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.schedule = schedule
        self.port = port
        self.events: list[Event] = []
        self._counter = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port), self._loop
        ).result()
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Close the server, end every connection's handler, then stop and close the loop. A
        handler left pending (a keep-alive connection waiting for its next request) would be
        destroyed whenever the garbage collector meets it, in another test, running its
        ``finally`` there: on Python 3.11 that can break whatever that test is compiling
        ("AST constructor recursion depth mismatch")."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def count(self, action_prefix: str) -> int:
        """How many requests got an action starting with ``action_prefix``."""
        return sum(e.action.startswith(action_prefix) for e in self.events)

    # ------------------------------------------------------------------ one connection
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another on this connection
                request = await _read_message(reader, request=True)
                if request is None:
                    return
                head, headers, body = request
                method, path = head.split(" ")[:2]
                try:
                    payload = json.loads(body) if body else {}
                except ValueError:
                    payload = {}
                n = next(self._counter)
                action = self.schedule(n, payload) if path.endswith("completions") else "pass"
                event = Event(n, path, action, None, payload, time.monotonic())
                self.events.append(event)
                if action == "reset":
                    _reset(writer)
                    return
                if action.isdigit():
                    event.status = int(action)
                    message = {"error": {"message": f"injected HTTP {action}", "type": "injected", "code": int(action)}}
                    await _respond(writer, int(action), json.dumps(message).encode())
                    continue
                if action.startswith("retry-after:"):
                    event.status = 429
                    message = {"error": {"message": "injected rate limit", "type": "rate_limit", "code": 429}}
                    await _respond(writer, 429, json.dumps(message).encode(), {"Retry-After": action.split(":", 1)[1]})
                    continue
                if action == "stall":
                    await reader.read()  # until the client gives up and closes (EOF or reset)
                    return
                if action.startswith("delay:"):
                    await asyncio.sleep(float(action.split(":", 1)[1]))
                status, response = await self._forward(method, path, headers, body)
                if action.startswith(("rewrite:", "rewrite-first:")) and status == 200:
                    response = _rewrite(response, action.split(":", 1)[1], only_first=action.startswith("rewrite-first:"))
                try:
                    await _respond(writer, status, response)
                except ConnectionError:
                    return  # the client gave up (timeout) while we waited
                event.status = status
                event.usage = _usage(response) if status == 200 else {}
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            return  # the proxy stops (``stop``): the connection ends here, quietly
        finally:
            if not writer.is_closing():
                writer.close()

    async def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(*self.upstream)
        try:
            keep = {k: v for k, v in headers.items() if k not in ("connection", "content-length", "host", "keep-alive")}
            lines = [f"{method} {path} HTTP/1.1", f"Host: {self.upstream[0]}:{self.upstream[1]}", "Connection: close",
                     f"Content-Length: {len(body)}"] + [f"{k}: {v}" for k, v in keep.items()]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            await writer.drain()
            message = await _read_message(reader, request=False)
            if message is None:
                raise ConnectionResetError("upstream closed the connection")
            head, _, response = message
            return int(head.split(" ")[1]), response
        finally:
            writer.close()


async def _read_message(reader: asyncio.StreamReader, request: bool) -> tuple[str, dict[str, str], bytes] | None:
    """One HTTP/1.1 message: start line, lower-cased headers, body (length or chunked)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise
    head, *header_lines = raw.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        headers.pop("transfer-encoding")
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    else:
        body = b"" if request else await reader.read()
    return head, headers, body


async def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Status")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: keep-alive\r\n\r\n")
    writer.write(head.encode() + body)
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed server or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def _usage(response: bytes) -> dict:
    """The ``usage`` object of a JSON answer (completions, chat completions); {} for any other."""
    try:
        usage = json.loads(response).get("usage")
    except (ValueError, AttributeError):
        return {}
    return usage if isinstance(usage, dict) else {}


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
