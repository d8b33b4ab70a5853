"""A real headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL on file descriptors 3 and 4) — stdlib only, no port, no downloads.

Install the browser with ``make browser`` (Debian's ``chromium``; ``apt-get`` as root).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--mute-audio",
)


def find_browser() -> str | None:
    env = os.environ.get("RLM_TEST_CHROMIUM")
    if env:
        return env
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    pass


class Chromium:
    """One headless browser process; :meth:`open` returns a :class:`Page` attached to a new tab."""

    def __init__(self, executable: str, *, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="rlm-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # in the child, before exec: the pipe ends become fds 3 and 4
            r, w = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [
                executable,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            close_fds=False,
            preexec_fn=fds,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        os.set_blocking(self._from_child, False)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.version = self.call("Browser.getVersion")["product"]

    # -- protocol ---------------------------------------------------------------------------------

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError("timed out waiting for Chromium")
            ready, _, _ = select.select([self._from_child], [], [], left)
            if ready:
                chunk = os.read(self._from_child, 1 << 20)
                if not chunk:
                    raise CdpError(f"Chromium exited: {self._stderr_tail()}")
                self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        doc: dict[str, Any] = json.loads(raw)
        return doc

    def _stderr_tail(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None:
            return "(still running)"
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def call(
        self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None
    ) -> dict[str, Any]:
        self._next_id += 1
        msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._to_child, data) :]
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def open(self, width: int = 1440, height: int = 900) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        page.call("Page.enable")
        page.call("Runtime.enable")
        page.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(CdpError):
                    self.call("Browser.close")
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._to_child, self._from_child):
                with contextlib.suppress(OSError):
                    os.close(fd)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session)

    def navigate(self, url: str) -> None:
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CdpError(f"navigate {url}: {result['errorText']}")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JavaScript expression (promises awaited)."""
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout_s: float = 30.0, what: str = "") -> Any:
        """Poll ``expression`` until it is truthy (bounded); return its value."""
        deadline = time.monotonic() + timeout_s
        value: Any = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except CdpError as err:  # e.g. the document is still being replaced
                value = err
            else:
                if value:
                    return value
            time.sleep(0.1)
        raise CdpError(
            f"timed out after {timeout_s} s waiting for {what or expression}; last value {value!r}"
        )

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not just the viewport)."""
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        width = int(self.evaluate("document.documentElement.clientWidth"))
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def dom(self) -> str:
        return str(self.evaluate("document.documentElement.outerHTML"))


def dump_dom(executable: str, url: str, *, budget_ms: int = 5000, timeout_s: float = 60) -> str:
    """Chromium's own CLI: load ``url``, run scripts for ``budget_ms`` of virtual time, print the DOM."""
    with tempfile.TemporaryDirectory(prefix="rlm-chromium-") as profile:
        proc = subprocess.run(
            [
                executable,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--virtual-time-budget={budget_ms}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if proc.returncode != 0:
        raise CdpError(f"chromium --dump-dom exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout
