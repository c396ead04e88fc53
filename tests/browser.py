"""A real headless Chromium for the tests: a page's DOM after its scripts
ran (``chromium``), or a page driven over the DevTools protocol
(``DevTools``). Needs Debian's ``chromium`` package (/usr/bin/chromium);
without it the tests fail, they do not skip."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_TIMEOUT_SECONDS = 20


def chromium_binary() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "chromium is not installed: these tests need a real headless browser. "
            "Install Debian's package: apt-get install -y chromium"
        )
    return path


def chromium(url: str, profile: Path, *extra: str) -> str:
    """What Chromium prints for ``url`` (the DOM, by default)."""
    args = [
        chromium_binary(),
        *CHROMIUM_FLAGS,
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *(extra or ("--dump-dom",)),
        url,
    ]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_SECONDS, check=False
    )
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class DevTools:
    """Chromium driven over the DevTools protocol on a pipe (fds 3 and 4,
    messages ending in NUL): no port, no extra package. Real time, not
    virtual, so that clicks and their fetches run as they would for a user."""

    def __init__(self, url: str, profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fds are 3 and 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [chromium_binary(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.url = url
        self._buffer = b""
        self._next_id = 0
        self.session = ""

    def __enter__(self) -> DevTools:
        targets: list[dict[str, Any]] = self.call("Target.getTargets", session=False)["targetInfos"]  # type: ignore[assignment]
        page = next(t for t in targets if t["type"] == "page")
        attached = self.call(
            "Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}, session=False
        )
        self.session = attached["sessionId"]  # type: ignore[assignment]
        self.goto(self.url)
        return self

    def goto(self, url: str) -> None:
        """Load ``url`` in the page and wait until it has loaded."""
        self.call("Page.navigate", {"url": url})
        deadline = time.monotonic() + 10
        # Page.navigate answers once the new document is committed.
        while self.run("document.readyState") != "complete":
            assert time.monotonic() < deadline, f"{url} did not load"
            time.sleep(0.02)

    def viewport(self, width: int, height: int, *, mobile: bool = False) -> None:
        """Emulate a screen of this size (a phone's, with ``mobile``)."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def color_scheme(self, scheme: str) -> None:
        """Emulate the system's light or dark preference ("": the default)."""
        features = [{"name": "prefers-color-scheme", "value": scheme}]
        self.call("Emulation.setEmulatedMedia", {"features": features})

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page, written to ``path``."""
        shot = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(str(shot["data"])))
        return path

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait(10)
        os.close(self._r)
        os.close(self._w)

    def call(self, method: str, params: dict[str, object] | None = None, *, session: bool = True,
             timeout: float = CHROMIUM_TIMEOUT_SECONDS) -> dict[str, object]:  # fmt: skip
        self._next_id += 1
        message: dict[str, object] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        os.write(self._w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self._next_id:
                    assert "error" not in answer, answer["error"]
                    return answer["result"]  # type: ignore[no-any-return]
            left = deadline - time.monotonic()
            assert left > 0, f"chromium did not answer {method}"
            if select.select([self._r], [], [], left)[0]:
                chunk = os.read(self._r, 1 << 16)
                assert chunk, f"chromium closed the pipe (exit {self.proc.poll()})"
                self._buffer += chunk

    def run(self, script: str) -> object:
        """The value of an async JS expression, evaluated in the page."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": script, "awaitPromise": True, "returnByValue": True},
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"]["value"]  # type: ignore[index]
