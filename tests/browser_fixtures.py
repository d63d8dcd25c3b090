"""A headless Chromium driven over the DevTools protocol, for tests of the chat page.

Debian's `chromium` (installed by .ci/run); the tests that use it skip where it is absent.
No driver package: the DevTools protocol is JSON over one websocket (the `websockets`
package), which is all a test needs: navigate, evaluate JavaScript, collect console errors,
take a screenshot.
"""
from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--remote-debugging-port=0", "--window-size=1280,860"]
START_TIMEOUT = 30.0


def need_chromium() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it)")


class Browser:
    """One Chromium with one page. `call` sends a DevTools command and returns its result; events
    that arrive meanwhile are kept in `events`."""

    def __init__(self):
        # Chromium's helper processes may still write there after it exits: a leftover file is not a failure
        self._dir = tempfile.TemporaryDirectory(prefix="specserve-chromium-", ignore_cleanup_errors=True)
        self._log = open(Path(self._dir.name) / "chromium.log", "wb")
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self._dir.name}", "about:blank"],
                                     stdout=self._log, stderr=subprocess.STDOUT)
        self.ws, self._ids, self.events = None, itertools.count(1), []
        try:
            self._connect()
        except BaseException:
            self.close()
            raise

    def _connect(self) -> None:
        from websockets.sync.client import connect

        port = self._port()
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                     if t["type"] == "page"]
            if pages or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=START_TIMEOUT).__enter__()
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable")

    def _port(self) -> int:
        """The DevTools port Chromium chose (--remote-debugging-port=0 writes it to a file)."""
        path = Path(self._dir.name) / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}: {self.log()[-2000:]}")
            if path.exists() and (lines := path.read_text().split()):
                return int(lines[0])
            time.sleep(0.05)
        raise RuntimeError(f"chromium did not open its DevTools port: {self.log()[-2000:]}")

    def log(self) -> str:
        return (Path(self._dir.name) / "chromium.log").read_text(errors="replace")

    def call(self, method: str, timeout: float = 30.0, **params) -> dict:
        i = next(self._ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def wait(self, expression: str, timeout: float = 30.0, what: str = ""):
        """Poll until the expression is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or expression}; console: {self.errors()}")

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && location.href.startsWith(%s)" % json.dumps(url))

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed loads (CSP refusals among them) so far."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif e["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append("log: " + p["entry"]["text"] + " " + p["entry"].get("url", ""))
        return out

    def screenshot(self, path: Path) -> None:
        out = self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(out["data"]))

    def close(self) -> None:
        try:
            if self.ws is not None:
                self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
            self._dir.cleanup()
