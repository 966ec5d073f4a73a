"""Headless Chromium, to look at a page as a reader's browser shows it: the tests check judge-calibrate's
report.html with it, and docs/report_screenshot.py takes the docs' picture of the report.

Chromium and ChromeDriver are Debian's (`apt-get install chromium chromium-driver`; .ci/run installs them),
driven through ChromeDriver's WebDriver protocol with the standard library alone: no browser download, no
Python package. Chromium runs with a fresh profile and without its background traffic (updates, sync, QUIC):
on a machine without network it would otherwise try, and fail, many connections at every start.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "chromium", "chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
TIMEOUT_S = 60  # for one WebDriver command; a page of a few MB of embedded PNGs loads in about a second


def missing() -> str | None:
    """Why no browser can be started here, or None."""
    absent = [name for name in (CHROMIUM, CHROMEDRIVER) if shutil.which(name) is None]
    return f"{' and '.join(absent)} not found (apt-get install chromium chromium-driver)" if absent else None


@dataclass(frozen=True)
class PageImage:
    alt: str
    loaded: bool  # complete, with pixels
    natural: tuple[int, int]  # the PNG's width and height
    shown: tuple[float, float]  # as laid out, in CSS pixels, border excluded


@dataclass(frozen=True)
class Page:
    width: int  # of the viewport, in CSS pixels
    scroll_width: int  # of the document: more than `width` means the page scrolls sideways
    height: int  # of the document
    images: list[PageImage]
    errors: list[str]  # what the console said at level error (failed loads included)
    top: dict[str, float]  # the top edge of each h2, by its text, in CSS pixels from the page's top


# Read in the page: every image as laid out (its content box, so that a border does not count as stretch).
PAGE_SCRIPT = """
const shown = img => { const s = getComputedStyle(img), r = img.getBoundingClientRect();
  const px = k => parseFloat(s[k]);
  return [r.width - px('borderLeftWidth') - px('borderRightWidth'), r.height - px('borderTopWidth') - px('borderBottomWidth')]; };
return {scroll_width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
  images: [...document.images].map(i => ({alt: i.alt, loaded: i.complete && i.naturalWidth > 0,
                                          natural: [i.naturalWidth, i.naturalHeight], shown: shown(i)})),
  top: Object.fromEntries([...document.querySelectorAll('h2')].map(h => [h.textContent, h.getBoundingClientRect().top + scrollY]))};
"""


class Browser:
    """One headless Chromium: `open` a file at a width, then `screenshot` it. A context manager: the browser
    and its driver end with it."""

    def __init__(self):
        if reason := missing():
            raise RuntimeError(reason)
        self._profile = tempfile.TemporaryDirectory(prefix="mmjudge-chromium-")
        port = _free_port()
        self._driver = subprocess.Popen([shutil.which(CHROMEDRIVER), f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._url = f"http://127.0.0.1:{port}"
        self._session = None
        try:
            self._wait_for_driver()
            options = {"binary": shutil.which(CHROMIUM), "args": [*FLAGS, f"--user-data-dir={self._profile.name}"]}
            capabilities = {"browserName": "chrome", "goog:chromeOptions": options, "goog:loggingPrefs": {"browser": "ALL"}}
            self._session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})["sessionId"]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, path: Path, width: int, height: int = 900) -> Page:
        """The page at `path` laid out in a viewport `width` x `height` CSS pixels (at one device pixel each),
        once loaded with its images, and what the console said meanwhile."""
        self._cdp("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self._log()  # what an earlier page said is not this one's
        self._command("POST", "url", {"url": Path(path).resolve().as_uri()})  # returns once the page and its images have loaded
        seen = self._command("POST", "execute/sync", {"script": PAGE_SCRIPT, "args": []})
        errors = [entry["message"] for entry in self._log() if entry["level"] == "SEVERE"]
        images = [PageImage(i["alt"], i["loaded"], tuple(i["natural"]), tuple(i["shown"])) for i in seen["images"]]
        return Page(width, seen["scroll_width"], seen["height"], images, errors, seen["top"])

    def screenshot(self, path: Path, height: int | None = None) -> None:
        """A PNG of the open page: the whole of it, or its top `height` CSS pixels."""
        params = {"format": "png", "captureBeyondViewport": True}
        if height is not None:
            params["clip"] = {"x": 0, "y": 0, "width": self._command("POST", "execute/sync", {"script": "return innerWidth", "args": []}),
                              "height": height, "scale": 1}
        Path(path).write_bytes(base64.b64decode(self._cdp("Page.captureScreenshot", params)["data"]))

    def close(self) -> None:
        try:
            if self._session is not None:
                self._call("DELETE", f"/session/{self._session}")
        finally:
            self._session = None
            self._driver.terminate()
            try:
                self._driver.wait(10)
            except subprocess.TimeoutExpired:
                self._driver.kill()
                self._driver.wait()
            self._profile.cleanup()

    def _wait_for_driver(self) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                if self._call("GET", "/status").get("ready"):
                    return
            except OSError:
                pass
            if self._driver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{CHROMEDRIVER} did not start (exit code {self._driver.poll()})")
            time.sleep(0.1)

    def _log(self) -> list[dict]:
        """The console's entries since the last call (ChromeDriver's log endpoint, which Selenium uses too)."""
        return self._command("POST", "se/log", {"type": "browser"})

    def _cdp(self, method: str, params: dict) -> dict:
        """A Chrome DevTools Protocol command, through ChromeDriver."""
        return self._command("POST", "goog/cdp/execute", {"cmd": method, "params": params})

    def _command(self, method: str, command: str, body: dict | None = None):
        return self._call(method, f"/session/{self._session}/{command}", body)

    def _call(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self._url + path, data, {"Content-Type": "application/json"}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as err:  # WebDriver's own error, in its words
            raise RuntimeError(f"{CHROMEDRIVER}: {method} {path}: {json.loads(err.read()).get('value', {}).get('message', err)}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
