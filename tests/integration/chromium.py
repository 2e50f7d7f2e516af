"""Headless Chromium (Debian's `chromium` package) for the report tests: DOM dumps and screenshots.

A missing browser fails the test with the command that installs it (never a skip). Each run gets
its own profile folder, so runs never share state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

INSTALL = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium"


def chromium_binary() -> str:
    found = os.environ.get("ENTROLOOP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(f"headless Chromium is needed for the report test; install it with `{INSTALL}`", pytrace=False)
    return found


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run(
        [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=180,
    )


def dump_dom(tmp_path: Path, page: Path, width: int = 1440, height: int = 1000) -> str:
    """The DOM after the page's scripts ran, laid out in a ``width`` x ``height`` window."""
    proc = run_chromium(tmp_path, f"--window-size={width},{height}", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def screenshot(tmp_path: Path, page: Path, shot: Path, width: int, height: int) -> bytes:
    """A PNG of the page's first ``height`` pixels in a ``width`` wide window, written to ``shot``."""
    proc = run_chromium(tmp_path, f"--window-size={width},{height}", "--hide-scrollbars", f"--screenshot={shot}",
                        page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{shot} is not a PNG"
    return data





class DevTools:
    """One headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages separated by NUL, commands on fd 3, answers on fd 4), for what command-line flags
    cannot do: a phone-sized viewport (a headless window is at least 500 px wide), running a probe in
    the page, a screenshot of exactly that viewport.
    """

    def __init__(self, tmp_path: Path) -> None:
        profile = tmp_path / f"chromium-devtools-{len(list(tmp_path.iterdir()))}"
        profile.mkdir()
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_pipes() -> None:  # in the child: its fd 3 reads our commands, its fd 4 writes answers
            # via fresh descriptors first: a pipe end may already be 3 or 4, and dup2 onto itself would
            # leave it close-on-exec
            commands, answers = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(commands, 3)
            os.dup2(answers, 4)

        self.proc = subprocess.Popen(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=wire_pipes, close_fds=False,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self, deadline: float) -> dict:
        import json
        import select
        import time

        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer over the DevTools pipe")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, timeout: float = 60.0, **params: object) -> dict:
        """Send one command and return its result (events that arrive meanwhile are kept)."""
        import json
        import time

        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self._events.append(answer)

    def open(self, page: Path, width: int, height: int, mobile: bool = False, timeout: float = 60.0) -> None:
        """Load ``page`` in a ``width`` x ``height`` viewport and wait for its load event."""
        import time

        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)
        self._events.clear()
        self.call("Page.navigate", session=True, url=page.as_uri())
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            self._events.append(self._read(deadline))

    def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, shot: Path) -> bytes:
        """A PNG of the viewport, written to ``shot``."""
        import base64

        data = base64.b64decode(self.call("Page.captureScreenshot", session=True, format="png")["data"])
        shot.write_bytes(data)
        return data

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)

    def __enter__(self) -> DevTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

__all__ = ["DevTools", "chromium_binary", "dump_dom", "run_chromium", "screenshot"]
