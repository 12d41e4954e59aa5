"""A counting HTTP proxy on 127.0.0.1 in front of a real OpenAI-compatible server: it passes every
request through and records it (``events``: path, status, the answer's token usage), so it counts
what a client sends and what the server reports it computed. Plain asyncio streams, no framework.

benchmarks/served.py counts a run's requests and tokens with it; the test suite's fault-injecting
proxy (tests/support/fault_proxy.py) is this one answering some requests otherwise.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Event:
    """One request the proxy handled: its number, path, the action and what the client got."""

    n: int
    path: str
    action: str  # "pass" (sent upstream, the answer passed back) unless a subclass answers otherwise
    status: int | None  # the HTTP status sent to the client; None for a reset or a client that left
    body: dict = field(repr=False, default_factory=dict)
    at: float = 0.0  # time.monotonic() when the request arrived
    usage: dict = field(default_factory=dict)  # the answer's token usage (prompt_tokens, completion_tokens), if any


class CountingProxy:
    """The proxy, serving on its own thread and event loop (``with CountingProxy(...) as p``).

    Args:
        upstream_port: the real server's port on 127.0.0.1.
        port: where to listen (0 = any free port; see ``base_url``).
    """

    def __init__(self, upstream_port: int, port: int = 0, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.port = port
        self.events: list[Event] = []
        self._counter = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=type(self).__name__, daemon=True)
        self._server: asyncio.base_events.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "CountingProxy":
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

    def __enter__(self) -> "CountingProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ what a request gets
    def _action(self, n: int, path: str, body: dict) -> str:
        """The action for request ``n`` (from 0) to ``path`` with JSON ``body``: "pass" here."""
        return "pass"

    async def _answer(self, event: Event, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                      headers: dict[str, str], body: bytes) -> bool:
        """Answer the client as ``event.action`` says; whether the connection serves another request."""
        return await self._pass(event, writer, method, headers, body)

    async def _pass(self, event: Event, writer: asyncio.StreamWriter, method: str, headers: dict[str, str], body: bytes,
                    edit: Callable[[bytes], bytes] | None = None) -> bool:
        """Send the request upstream and its answer (``edit``-ed, if given and HTTP 200) back to the client."""
        status, response = await self._forward(method, event.path, headers, body)
        if edit is not None and status == 200:
            response = edit(response)
        try:
            await respond(writer, status, response)
        except ConnectionError:
            return False  # the client gave up (timeout) while we waited
        event.status = status
        event.usage = _usage(response) if status == 200 else {}
        return True

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
                event = Event(n, path, self._action(n, path, payload), None, payload, time.monotonic())
                self.events.append(event)
                if not await self._answer(event, reader, writer, method, headers, body):
                    return
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


async def respond(writer: asyncio.StreamWriter, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    """Answer the client: ``status``, a JSON ``body``, extra ``headers``; the connection kept alive."""
    reason = {200: "OK", 429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Status")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: keep-alive\r\n\r\n")
    writer.write(head.encode() + body)
    await writer.drain()


def _usage(response: bytes) -> dict:
    """The token usage of a JSON answer: OpenAI's ``usage`` object (completions, chat completions), or
    llama-server's own ``/completion`` counts (``tokens_evaluated``, ``tokens_predicted``) under the same
    names; {} for any other answer."""
    try:
        data = json.loads(response)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    usage = data.get("usage")
    if isinstance(usage, dict):
        return usage
    if "tokens_evaluated" in data and "tokens_predicted" in data:
        return {"prompt_tokens": data["tokens_evaluated"], "completion_tokens": data["tokens_predicted"]}
    return {}
