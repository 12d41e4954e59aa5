"""Headless Chromium driven over the DevTools protocol (through a pipe, no extra packages).

Opens a page offline, records console messages, exceptions and network requests, reads
the rendered text through shadow roots, inspects every canvas, every Bokeh plot's title and
legend boxes and the computed styles of elements, and takes a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# Text of the page, including text inside shadow roots (Panel renders into them).
DEEP_TEXT = """
(() => {
  const parts = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (['SCRIPT', 'STYLE', 'NOSCRIPT'].includes(node.nodeName)) return;
    if (node.shadowRoot) walk(node.shadowRoot);
    for (const child of node.childNodes) walk(child);
  };
  walk(document.documentElement);
  return parts.join(' ');
})()
"""

# Every Bokeh plot canvas (found through shadow roots): its size, whether it is shown, and
# how many sampled pixels of its layers differ from the top-left pixel ("inked").
CANVASES = """
(() => {
  const plots = [];
  const walk = (node) => {
    if (node.shadowRoot) walk(node.shadowRoot);
    if (node.classList && node.classList.contains('bk-Canvas')) plots.push(node);
    for (const child of node.children || []) walk(child);
  };
  walk(document.documentElement);
  const inked = (c) => {
    const ctx = c.getContext('2d');
    if (!ctx || !c.width || !c.height) return 0;
    const d = ctx.getImageData(0, 0, c.width, c.height).data;
    const [r, g, b, a] = [d[0], d[1], d[2], d[3]];
    let n = 0;
    for (let i = 0; i < d.length; i += 16) {
      if (Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) + Math.abs(d[i + 3] - a) > 30) n++;
    }
    return n;
  };
  return plots.map((p) => {
    const layers = [...(p.shadowRoot || p).querySelectorAll('canvas')];
    const box = p.getBoundingClientRect();
    return {width: box.width, height: box.height, shown: box.width > 0 && box.height > 0,
            layers: layers.length, inked: layers.reduce((s, c) => s + inked(c), 0)};
  });
})()
"""


# Every Bokeh figure, found through Bokeh's views: its title text, and the page boxes (left, top,
# right, bottom in CSS pixels) of its canvas, of its title's drawn text and of its legends.
PLOTS = """
(() => {
  const plots = [], seen = new Set();
  const walk = (view) => {
    if (!view || seen.has(view)) return;
    seen.add(view);
    if (view.model && view.model.type === 'Figure') plots.push(view);
    if (typeof view.children === 'function') for (const child of view.children()) walk(child);
  };
  for (const root of Bokeh.index.roots) walk(root);
  const edges = (r) => ({left: r.left, top: r.top, right: r.right, bottom: r.bottom});
  return plots.map((plot) => {
    const canvas = plot.canvas_view.el.getBoundingClientRect();
    const out = {title: plot.model.title ? plot.model.title.text : '', canvas: edges(canvas), legends: [], titles: []};
    for (const view of plot.children()) {
      if (view.model.type === 'Legend') {
        const box = view.el.getBoundingClientRect();  // legends are HTML laid over the canvas
        if (box.width > 0) out.legends.push(edges(box));
      } else if (view.model.type === 'Title' && view._rect) {
        // The title is drawn on the canvas: where its text went, from its anchor point and size.
        const {sx, sy, width, height} = view._rect, anchor = view.anchor;
        const left = canvas.left + sx - anchor.x * width, top = canvas.top + sy - anchor.y * height;
        out.titles.push({left, top, right: left + width, bottom: top + height});
      }
    }
    return out;
  });
})()
"""

# Elements matching a CSS selector, in the document and every shadow root: tag, text and the
# computed values of the given CSS properties.
STYLES = """
((selector, properties) => {
  const found = [];
  const walk = (root) => {
    root.querySelectorAll(selector).forEach((e) => found.push(e));
    root.querySelectorAll('*').forEach((e) => { if (e.shadowRoot) walk(e.shadowRoot); });
  };
  walk(document);
  return found.map((e) => {
    const style = getComputedStyle(e);
    return {tag: e.tagName.toLowerCase(), text: e.textContent.trim(),
            style: Object.fromEntries(properties.map((p) => [p, style.getPropertyValue(p)]))};
  });
})
"""


@dataclass
class PageLoad:
    """What happened while a page loaded."""

    console: list[dict[str, Any]] = field(default_factory=list)  # type, text
    exceptions: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        """Console errors and uncaught exceptions."""
        return [c["text"] for c in self.console if c["type"] in ("error", "assert")] + self.exceptions


class Chromium:
    """One headless Chromium process and one page in it."""

    def __init__(self, width: int = 1400, height: int = 1000, allow: tuple[str, ...] = ()):
        """``allow``: hosts the page may reach (e.g. a local server's 127.0.0.1); nothing else resolves."""
        rules = ", ".join(["MAP * ~NOTFOUND"] + [f"EXCLUDE {host}" for host in allow])
        self.profile = tempfile.mkdtemp(prefix="keynes-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands from fd 3 and writes replies to fd 4.
        fds = {3: to_chrome_r, 4: from_chrome_w}

        def child_fds() -> None:
            import fcntl

            # Move both ends above 10 first, so placing one cannot overwrite the other.
            high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 10) for target, source in fds.items()}
            for target, source in high.items():
                os.dup2(source, target)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--hide-scrollbars", "--remote-debugging-pipe",
             # No network at all: a page that needs one fails loudly here.
             f"--host-resolver-rules={rules}", f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Not close_fds: it would run after child_fds and close 3 and 4 again.
            preexec_fn=child_fds, close_fds=False,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=True)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)

    # ------------------------------------------------------------------ protocol
    def _read(self, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no reply from Chromium")
            import select

            ready, _, _ = select.select([self._from_chrome], [], [], 0.5)
            if ready:
                chunk = os.read(self._from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: bool = False, timeout_s: float = 60) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read(timeout_s)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)

    def _drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                self._events.append(self._read(max(0.05, end - time.monotonic())))
            except TimeoutError:
                return

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in result:
            raise RuntimeError(str(result["exceptionDetails"]))
        return result["result"].get("value")

    # ------------------------------------------------------------------ page
    def open(self, url: str, canvases: int, timeout_s: float = 90) -> PageLoad:
        """Load ``url`` and wait until at least ``canvases`` canvases are drawn (or time out)."""
        self._events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._drain(1.0)
            if not any(e.get("method") == "Page.loadEventFired" for e in self._events):
                continue  # the previous document may still be the one shown
            state = self.evaluate(f"document.readyState === 'complete' && ({CANVASES}).filter(c => c.inked > 0).length")
            if state is not False and state is not None and state >= canvases:  # 0 canvases drawn is an answer too
                break
        self._drain(1.5)  # late console messages
        load = PageLoad()
        for event in self._events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                load.console.append({"type": params.get("type"), "text": text})
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                load.exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                load.console.append({"type": entry.get("level"), "text": entry.get("text", "") + " " + entry.get("url", "")})
            elif method == "Network.requestWillBeSent":
                load.requests.append(params["request"]["url"])
            elif method == "Network.loadingFailed":
                load.failed.append(params.get("errorText", ""))
        return load

    def text(self) -> str:
        return self.evaluate(DEEP_TEXT)

    def canvases(self) -> list[dict[str, Any]]:
        return self.evaluate(CANVASES)

    def plots(self) -> list[dict[str, Any]]:
        """Every Bokeh figure: ``title`` and the page boxes of its ``canvas``, ``titles`` and ``legends``."""
        return self.evaluate(PLOTS)

    def styles(self, selector: str, properties: list[str]) -> list[dict[str, Any]]:
        """Elements matching ``selector`` (through shadow roots): ``tag``, ``text`` and ``style``,
        the computed value of each of ``properties``."""
        return self.evaluate(f"{STYLES}({json.dumps(selector)}, {json.dumps(properties)})")

    def screenshot(self, path: str | Path, full_page: bool = True) -> Path:
        """A PNG of the page (the whole scrollable height when ``full_page``)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            # Templates scroll inside a container, not the document: grow the viewport to
            # the tallest scrollable content so one shot holds the whole page.
            height = self.evaluate("Math.max(...[...document.querySelectorAll('*')].map(e => e.scrollHeight))")
            width = self.evaluate("window.innerWidth")
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": min(int(height) + 100, 16000), "deviceScaleFactor": 1, "mobile": False},
                      session=True)
            self._drain(2.0)
        data = self.send("Page.captureScreenshot", params, session=True, timeout_s=120)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout_s=10)
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
