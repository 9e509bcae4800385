"""The HTML report in a real browser: headless Chromium, driven over the DevTools protocol.

Chromium talks DevTools over a pipe (``--remote-debugging-pipe``: commands on fd 3, replies on
fd 4, NUL-separated JSON), so the test needs nothing but the stdlib and the Debian package
``chromium`` (installed by ``.ci/run``). No chromium is a failure, not a skip: a report that
was never opened in a browser is untested.

The screenshot lands in ``$SYNCSCOPE_SCREENSHOT_DIR`` when set, else in the test's tmp dir.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from syncscope.render.diff import compare, render_diff_html
from syncscope.render.html import render_html
from tests.helpers import runs

pytestmark = pytest.mark.slow  # launches Chromium

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)
RENDERED_JS = """
(() => {
  const charts = [...document.querySelectorAll('.chart')];
  return JSON.stringify({
    charts: charts.length,
    plotted: charts.filter(d => d.data && d.data.length > 0 && d.querySelector('svg.main-svg')).length,
    traces: charts.map(d => (d.data || []).length),
    failed: charts.filter(d => d.textContent.includes('failed to render')).length,
    images: document.querySelectorAll('img').length,
    alerted: window.__alerted || 0,
    verdict: (document.querySelector('.verdict h1') || {}).textContent || '',
    height: document.documentElement.scrollHeight,
  });
})()
"""


def chromium_binary() -> str:
    for name in (os.environ.get("SYNCSCOPE_CHROMIUM", ""), *CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    pytest.fail("chromium not found: install the Debian package 'chromium' (.ci/run does)")


class DevTools:
    """A minimal DevTools client over Chromium's pipe transport."""

    def __init__(self, user_data_dir: Path) -> None:
        to_child_r, self._send_fd = os.pipe()
        self._recv_fd, from_child_w = os.pipe()

        def wire_pipes() -> None:  # in the child, before exec: fds 3 and 4, whatever they were
            r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [chromium_binary(), *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            close_fds=False,
            preexec_fn=wire_pipes,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        self.session = ""

    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._send_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, event: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for seen in self.events:
            if seen.get("method") == event:
                return seen
        while True:
            reply = self._read(deadline)
            if "method" in reply:
                self.events.append(reply)
                if reply["method"] == event:
                    return reply

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._recv_fd], [], [], left)[0]:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._recv_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return dict(json.loads(raw))

    def close(self) -> None:
        os.close(self._send_fd)
        os.close(self._recv_fd)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def open_page(
    browser: DevTools, page: Path, width: int = 1400, height: int = 1000
) -> dict[str, Any]:
    """Load a page, wait until every chart is drawn, return what the page reports."""
    target = browser.call("Target.createTarget", url="about:blank")["targetId"]
    browser.session = browser.call("Target.attachToTarget", targetId=target, flatten=True)[
        "sessionId"
    ]
    for domain in ("Page", "Runtime", "Log", "Network"):
        browser.call(f"{domain}.enable")
    # Any alert() (an XSS payload firing) is counted, not shown.
    browser.call(
        "Page.addScriptToEvaluateOnNewDocument",
        source="window.alert = () => { window.__alerted = (window.__alerted || 0) + 1; };",
    )
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=height,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.call("Page.navigate", url=page.as_uri())
    browser.wait_for("Page.loadEventFired", timeout=60)
    return wait_for_charts(browser)


def wait_for_charts(browser: DevTools, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads(browser.evaluate(RENDERED_JS))
        if state["plotted"] + state["failed"] >= state["charts"] or time.monotonic() > deadline:
            return dict(state)
        time.sleep(0.1)


def screenshot(browser: DevTools, path: Path, width: int, height: int) -> None:
    """The whole page: reload into a viewport as tall as the page, then capture it.

    (Capturing beyond a short viewport, or resizing one after plotting, leaves charts drawn
    at stale positions in headless Chromium.)
    """
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        width=width,
        height=min(height, 12000),
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.events = [e for e in browser.events if e.get("method") != "Page.loadEventFired"]
    browser.call("Page.reload")
    browser.wait_for("Page.loadEventFired", timeout=60)
    wait_for_charts(browser)
    shot = browser.call("Page.captureScreenshot", format="png", timeout=60)
    path.write_bytes(base64.b64decode(shot["data"]))


def problems(browser: DevTools) -> list[str]:
    """Console errors and warnings, uncaught exceptions, and any request off the machine."""
    found = []
    for event in browser.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in (
            "error",
            "warning",
            "assert",
        ):
            found.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Runtime.exceptionThrown":
            found.append(f"exception: {params.get('exceptionDetails')}")
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
            found.append(f"log: {params['entry'].get('text')}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:", "about:")):
                found.append(f"network fetch: {url}")
    return found


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    client = DevTools(tmp_path / "profile")
    try:
        yield client
    finally:
        client.close()


def shots_dir(tmp_path: Path) -> Path:
    target = Path(os.environ.get("SYNCSCOPE_SCREENSHOT_DIR") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def test_report_renders_in_chromium(browser: DevTools, tmp_path: Path) -> None:
    # GIVEN a report of a redundant-sync run with trace data and a script named like an XSS
    run = runs.make_run(
        ranks=4,
        windows=12,
        sync_at=runs.every,
        overlap=True,
        command=("python", f"{runs.XSS}.py", "--accum", "4"),
    )
    findings = [runs.finding(script=f"{runs.XSS}.py"), runs.finding("missing-sync", "error")]
    page = tmp_path / "report.html"
    page.write_text(render_html(run, findings), encoding="utf-8")

    # WHEN chromium opens it
    state = open_page(browser, page)
    png = shots_dir(tmp_path) / "report.png"
    screenshot(browser, png, 1400, state["height"])
    print(f"screenshot: {png}")

    # THEN every chart holds data, nothing errs, nothing is fetched, the payload stays text
    assert state["charts"] == 5  # placement, syncs, per window, timeline, overlap
    assert state["plotted"] == state["charts"], state
    assert all(n > 0 for n in state["traces"]), state
    assert problems(browser) == []
    assert state["images"] == 0 and state["alerted"] == 0
    assert "broken" in state["verdict"]
    assert png.stat().st_size > 50_000


def test_large_job_and_diff_render(browser: DevTools, tmp_path: Path) -> None:
    # GIVEN a 1,024-rank report and a before/after diff page
    big = tmp_path / "big.html"
    big.write_text(render_html(runs.huge(), runs.all_findings()), encoding="utf-8")
    diff = tmp_path / "diff.html"
    before, after = runs.redundant(), runs.clean_ddp()
    d = compare(before, [runs.finding()], after, [])
    diff.write_text(render_diff_html(d), encoding="utf-8")

    # WHEN chromium opens the large report
    started = time.monotonic()
    state = open_page(browser, big)
    took = time.monotonic() - started
    screenshot(browser, shots_dir(tmp_path) / "report-1024-ranks.png", 1400, state["height"])

    # THEN it is drawn with data, quickly, without errors
    assert state["plotted"] == state["charts"] == 4, state
    assert took < 8, f"1,024-rank page took {took:.1f} s to draw"
    assert problems(browser) == []

    # AND the diff page draws too
    browser.events.clear()
    state = open_page(browser, diff)
    screenshot(browser, shots_dir(tmp_path) / "diff.png", 1400, state["height"])
    assert state["plotted"] == state["charts"] >= 1, state
    assert problems(browser) == []


CLIPPED_JS = """JSON.stringify([...document.querySelectorAll('.tile *')]
  .filter(e => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right >
               e.closest('.tile').getBoundingClientRect().right + 1)
  .map(e => e.textContent.trim()))"""


@pytest.mark.parametrize("width", [1400, 1000])
def test_tile_text_is_never_cut_off(browser: DevTools, tmp_path: Path, width: int) -> None:
    # GIVEN a report whose tiles hold long values: a range of syncs, "not projected"
    def uneven(rank: int, window: int, mb: int, n: int) -> bool:
        return window < 2 or mb == n - 1

    run = runs.make_run(windows=3, micro_batches=6, sync_at=uneven)
    page = tmp_path / "report.html"
    page.write_text(render_html(run, [runs.finding()]), encoding="utf-8")
    # WHEN chromium lays it out at a laptop's and a narrow window's width
    state = open_page(browser, page, width=width)
    screenshot(browser, shots_dir(tmp_path) / f"tiles-{width}.png", width, state["height"])
    # THEN no tile's text overflows its box (it wraps instead of ending in "...")
    assert json.loads(browser.evaluate(CLIPPED_JS)) == []
    assert problems(browser) == []


TILE_ROWS_JS = """JSON.stringify([...document.querySelectorAll('#headline .tile')]
  .map(e => { const r = e.getBoundingClientRect(); return [Math.round(r.top), r.height]; }))"""


@pytest.mark.parametrize(("width", "per_row"), [(1400, 6), (800, 3)])
def test_headline_tiles_are_short_and_never_alone_on_a_row(
    browser: DevTools, tmp_path: Path, width: int, per_row: int
) -> None:
    """The speed-up tile was a paragraph that stretched every tile to ~450 px,
    and a seventh tile sat alone on a second row. Six tiles (communication and its exposed
    share are one): one row at 1400 px, two rows of three at 800 px, none taller than 200 px;
    how the figures are taken reads under the tiles."""
    from syncscope.analysis.diagnose import diagnose

    run = runs.traced()  # every tile: syncs, waste, window, speed-up, communication, memory
    page = tmp_path / "report.html"
    page.write_text(render_html(run, diagnose(run)), encoding="utf-8")
    state = open_page(browser, page, width=width)
    screenshot(browser, shots_dir(tmp_path) / f"headline-{width}.png", width, state["height"])
    tiles = json.loads(browser.evaluate(TILE_ROWS_JS))
    assert len(tiles) == 6, tiles
    rows: dict[int, int] = {}
    for top, _ in tiles:
        rows[top] = rows.get(top, 0) + 1
    assert sorted(rows.values()) == [per_row] * (6 // per_row), tiles
    assert max(height for _, height in tiles) < 200, tiles
    assert "basis: window time minus" in browser.evaluate(
        "document.querySelector('.basis').textContent"
    )
    assert json.loads(browser.evaluate(CLIPPED_JS)) == []
