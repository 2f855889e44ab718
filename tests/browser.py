"""Headless Chromium for tests, driven over the DevTools protocol (CDP) on its websocket.

Debian's `chromium` package (installed by scripts/install.sh); no browser download. Each browser
gets a fresh profile directory and a debugging port chosen by itself (read back from
`DevToolsActivePort`), so tests never share one.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
WINDOW = (1280, 800)


def chromium_path() -> str | None:
    """The Chromium executable, or None when the package is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab, through a flattened CDP session on the browser's websocket."""

    def __init__(self, socket: ClientConnection, session_id: str) -> None:
        self.socket = socket
        self.session_id = session_id
        self.events: list[dict[str, Any]] = []
        self._next_id = 1000

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a CDP method of the page and return its result (events seen meanwhile are kept)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params, "sessionId": self.session_id}
        self.socket.send(json.dumps(message))
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            answer = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            if "method" in answer:
                self.events.append(answer)

    def wait_event(self, method: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events:
                if event["method"] == method:
                    self.events.remove(event)
                    return event
            message = json.loads(self.socket.recv(timeout=max(0.1, deadline - time.monotonic())))
            if "method" in message:
                self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout_s} s: {expression}")
            time.sleep(0.1)
        return value

    def open_offline(self, url: str) -> None:
        """Navigate with the network cut off, and wait for the load event."""
        self.send("Network.enable")
        self.send(
            "Network.emulateNetworkConditions",
            offline=True,
            latency=0,
            downloadThroughput=-1,
            uploadThroughput=-1,
        )
        self.send("Page.enable")
        self.send("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def requested(self) -> list[str]:
        """The URLs of every request the page made so far."""
        self.send("Runtime.evaluate", expression="0")  # drain the events queued before now
        sent = [e for e in self.events if e["method"] == "Network.requestWillBeSent"]
        return [e["params"]["request"]["url"] for e in sent]

    def type_text(self, selector: str, text: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def press(self, key: str) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=13)

    def screenshot(self, path: Path) -> Path:
        shot = self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


@contextmanager
def chromium(profile: Path) -> Iterator[Page]:
    """A headless Chromium with a fresh profile in `profile`, and one blank page of it."""
    executable = chromium_path()
    assert executable, "chromium is not installed"
    command = [
        executable,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--no-default-browser-check",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "about:blank",
    ]
    with open(profile.parent / "chromium.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = _browser_url(profile, process)
            with connect(url, max_size=None, open_timeout=START_TIMEOUT_S) as socket:
                yield _new_page(socket)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _browser_url(profile: Path, process: subprocess.Popen[bytes]) -> str:
    active = profile / "DevToolsActivePort"
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (active.exists() and len(active.read_text().splitlines()) >= 2):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"chromium did not start (see {profile.parent / 'chromium.log'})")
        time.sleep(0.05)
    port, path = active.read_text().splitlines()[:2]
    return f"ws://127.0.0.1:{port}{path}"


def _new_page(socket: ClientConnection) -> Page:
    def call(number: int, method: str, **params: Any) -> dict[str, Any]:
        socket.send(json.dumps({"id": number, "method": method, "params": params}))
        while True:
            answer = json.loads(socket.recv(timeout=CALL_TIMEOUT_S))
            if answer.get("id") == number:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                result: dict[str, Any] = answer["result"]
                return result

    target = call(1, "Target.createTarget", url="about:blank")
    attached = call(2, "Target.attachToTarget", targetId=target["targetId"], flatten=True)
    page = Page(socket, attached["sessionId"])
    width, height = WINDOW
    metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
    page.send("Emulation.setDeviceMetricsOverride", **metrics)
    return page
