"""The built documentation site, opened page by page in a headless Chromium (``pytest -m browser``,
after ``python -m sphinx -W -b html docs build/docs``).

The site is served from 127.0.0.1 by a server in this process; Chromium is driven through the
DevTools protocol (websocket-client) with every request intercepted: a request for anything but
the built folder is recorded and refused (and the browser resolves no host name but the local
one, so nothing can leave even if interception missed it). Each page then fails on any such
request, on a formula left as raw TeX, on a broken internal link or anchor, and on an image that
did not load. Skipped, saying why, where Chromium, websocket-client or the built site is missing.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("MINITFM_DOCS_BUILD", ROOT / "build" / "docs"))
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
# TeX that should have become MathML: a backslash command, or a $$ / \( / \[ delimiter
RAW_TEX = re.compile(r"\\(frac|partial|sum|mathrm|mathbb|top|cdot|sqrt|hat|odot|left|right|begin|"
                     r"end|quad|text|mathcal|lVert|overline|underbrace|ldots|le|ge|in)\b|\$\$|\\\(|\\\[")

# Text of the page outside code and outside MathML, and what is wrong inside the MathML.
PAGE_REPORT = r"""(() => {
  const skip = new Set(["PRE", "CODE", "SCRIPT", "STYLE", "math", "TEXTAREA"]);
  const texts = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { texts.push(node.textContent); return; }
    if (node.nodeType !== Node.ELEMENT_NODE || skip.has(node.nodeName)) return;
    for (const child of node.childNodes) walk(child);
  };
  walk(document.body);
  const math = [...document.querySelectorAll("math")];
  const empty = [...document.querySelectorAll("span.math, div.math")]
    .filter(e => !e.querySelector("math")).map(e => e.textContent.slice(0, 80));
  return JSON.stringify({
    text: texts.join(" "),
    math: math.length,
    badMath: math.filter(m => /\\[A-Za-z]|&/.test(m.textContent)
                              || m.querySelector("merror")).map(m => m.textContent.slice(0, 80)),
    unrendered: empty,
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    images: [...document.querySelectorAll("img")].map(i => [i.src, i.complete && i.naturalWidth > 0]),
    ids: [...document.querySelectorAll("[id]")].map(e => e.id),
  });
})()"""


def find_browser() -> str | None:
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    return None


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Browser:
    """One headless Chromium and a DevTools connection to one page of it."""

    def __init__(self, executable: str, origin: str):
        import websocket        # websocket-client, from the [docs] extra

        self.origin = origin
        self.profile = tempfile.mkdtemp(prefix="minitfm-docs-browser-")
        self.process = subprocess.Popen(
            [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
             "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
             f"--user-data-dir={self.profile}", "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().split("\n")) >= 2):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port, path = port_file.read_text().split("\n")[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=30)
        self.next_id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Network.enable", session=True)
        self.call("Fetch.enable", session=True, patterns=[{"urlPattern": "*"}])
        self.outside: list[str] = []        # every request for something outside the site

    def call(self, method: str, session: bool = False, **params):
        self.next_id += 1
        wanted = self.next_id       # handle() may send commands of its own while we wait
        message = {"id": wanted, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == wanted:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.handle(reply)

    def handle(self, event: dict) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Fetch.requestPaused":
            url = params["request"]["url"]
            if url.startswith(self.origin + "/"):
                self.send("Fetch.continueRequest", requestId=params["requestId"])
            else:
                self.outside.append(url)
                self.send("Fetch.failRequest", requestId=params["requestId"],
                          errorReason="BlockedByClient")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith((self.origin + "/", "data:", "about:", "blob:")):
                self.outside.append(url)
        elif method == "Network.webSocketCreated":
            self.outside.append(params["url"])
        else:
            self.events.append(event)

    def send(self, method: str, **params) -> None:   # a command whose reply is not awaited
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params,
                                 "sessionId": self.session}))

    def open(self, url: str) -> dict:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading")
            self.handle(json.loads(self.ws.recv()))
        result = self.call("Runtime.evaluate", session=True, expression=PAGE_REPORT,
                           returnByValue=True)
        return json.loads(result["result"]["value"])

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def site():
    """(browser, origin) for the built site, served from 127.0.0.1."""
    executable = find_browser()
    if executable is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    try:
        import websocket  # noqa: F401
    except ImportError:
        pytest.skip("websocket-client is not installed (pip install -e '.[docs]')")
    if not (SITE / "index.html").exists():
        pytest.skip(f"no built site at {SITE}: python -m sphinx -W -b html docs build/docs")
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    browser = Browser(executable, origin)
    yield browser, origin
    browser.close()
    server.shutdown()


PAGES = sorted(str(p.relative_to(SITE)) for p in SITE.rglob("*.html")) if SITE.exists() else []


def ids_of(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES or ["index.html"])
def test_page(site, page):
    browser, origin = site
    browser.outside.clear()
    report = browser.open(f"{origin}/{page}")
    assert not browser.outside, f"{page} asked the network for {sorted(set(browser.outside))}"
    raw = sorted(set(m.group(0) for m in RAW_TEX.finditer(report["text"])))
    assert not raw, f"{page} shows raw TeX outside code: {raw}"
    assert not report["unrendered"], f"{page}: formulas without MathML: {report['unrendered']}"
    assert not report["badMath"], f"{page}: MathML holding TeX: {report['badMath']}"
    broken = [src for src, loaded in report["images"] if not loaded]
    assert not broken, f"{page}: images that did not load: {broken}"
    for link in report["links"]:
        url, fragment = urldefrag(link)
        if not url.startswith(origin + "/"):
            assert urlparse(url).scheme in ("http", "https", "mailto"), f"{page}: odd link {link}"
            continue                                 # an external link: never followed here
        target = SITE / unquote(urlparse(url).path).lstrip("/")
        if target.is_dir():
            target = target / "index.html"
        assert target.is_file(), f"{page} links to {link}, which is not in the site"
        if fragment and target.suffix == ".html":
            assert unquote(fragment) in ids_of(target), f"{page} links to {link}: no such anchor"


def test_the_pages_that_promise_formulas_have_them(site):
    browser, origin = site
    for page, least in [("gradients.html", 100), ("backward.html", 10), ("walkthrough.html", 3)]:
        report = browser.open(f"{origin}/{page}")
        assert report["math"] >= least, f"{page} has {report['math']} formulas, expected {least}+"
