"""Legible at the sizes people use.

With the demo running, at 1280x800 and 1000x800: the dashboard never scrolls
sideways, no two visible pieces of text overlap, and no request from `/`
leaves the server; the fleet page reflows to two columns below ~1140 px; the
prefix tree's branch mark is drawn (no glyph the fonts lack) and its counts
are not cut off; histogram axis labels keep apart (their canvas text is
checked through the chart's own label positions).  Screenshots at 1600,
1280 and 1000 px land in test-artifacts/e2e/layout-*.png.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e import layout
from tests.e2e.conftest import ARTIFACTS, Page, Server, free_port, wait_for
from tests.support.cli import start_cli_observer, stop_cli_server
from tests.support.wait import CLIENT_TIMEOUT

pytestmark = pytest.mark.browser

WIDTHS = [1280, 1000]

FILLED_JS = """() => {
  const n = (sel) => document.querySelectorAll(sel).length;
  const bp = window.__bp;
  return {
    points: bp.model.points.length,
    events: n('#ev-body tr'), keys: n('#hm-body tr'), tree: n('#tree-body li'),
    requests: n('#req-body tr'), queue: n('#lru-body tr'), misses: n('#miss-body tr'),
    analysis: bp.analysis.series.points.length,
  };
}"""


def origin(url: str) -> str:
    u = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(u.scheme, u.scheme)
    return f"{scheme}://{u.netloc}"


def open_filled(browser: Any, server: Server, width: int, name: str) -> tuple[Page, list[str]]:
    """The dashboard at width x 800 with every panel showing data; the URLs it asked for."""
    page = Page(browser, server.url, name, viewport={"width": width, "height": 800})
    # the analysis row asks REST only while on screen: show it once
    page.page.locator("#analysis").scroll_into_view_if_needed()
    page.page.locator(".bottom").scroll_into_view_if_needed()
    wait_for(
        lambda: (got := page.js(FILLED_JS))["points"] > 20 and all(v > 0 for v in got.values()),
        timeout=40,
        what="every panel to show data",
    )
    page.js("() => window.scrollTo(0, 0)")
    return page, page.requests


@pytest.fixture(scope="module")
def demo(server: Server) -> Server:
    assert server.post("/api/demo/start").status_code == 200
    return server


@pytest.mark.parametrize("width", WIDTHS)
def test_dashboard_fits_without_overlap_or_outside_requests(
    browser: Any, demo: Server, width: int
) -> None:
    p, requests = open_filled(browser, demo, width, f"layout-{width}")
    try:
        side = layout.sideways(p.page)
        assert side["scrollWidth"] <= side["clientWidth"], f"sideways scroll at {width}: {side}"
        found = layout.overlaps(p.page)
        assert found["pieces"] > 300, "the page shows its text"
        assert found["overlaps"] == [], f"overlapping text at {width}x800"
        # every request the page made went to this server
        assert requests, "the requests were seen"
        local = ("data:", "blob:")
        outside = sorted({u for u in requests if not u.startswith(local) and origin(u) != demo.url})
        assert outside == []
        assert p.errors == []
        p.shot()
    finally:
        p.close()


def test_screenshots_at_1600_and_1280(browser: Any, demo: Server) -> None:
    for width in (1600, 1280):
        p, _ = open_filled(browser, demo, width, f"layout-shot-{width}")
        try:
            side = layout.sideways(p.page)
            assert side["scrollWidth"] <= side["clientWidth"]
            path = p.shot()
            assert path.stat().st_size > 50_000
        finally:
            p.close()


TREE_JS = """() => {
  const body = document.getElementById('tree-body');
  const box = body.getBoundingClientRect();
  const right = box.left + body.clientWidth;  // inside the scroll bar
  const cut = [];
  for (const el of body.querySelectorAll('.tag, .len, .chain > .muted')) {
    const r = el.getBoundingClientRect();
    const shown = r.width && r.bottom > box.top && r.top < box.bottom;
    if (shown && r.right > right + 1) cut.push(el.textContent);
  }
  const branch = body.querySelector('.tag.branch');
  const mark = branch && getComputedStyle(branch, '::before');
  return {
    cut, sideways: body.scrollWidth - body.clientWidth,
    branches: body.querySelectorAll('.tag.branch').length,
    text: branch ? branch.textContent : null,
    mark: mark && {w: parseFloat(mark.width), h: parseFloat(mark.height),
                   border: mark.borderLeftWidth},
  };
}"""


@pytest.mark.parametrize("width", [1000, 1600])
def test_prefix_tree_branch_mark_and_counts_show(browser: Any, demo: Server, width: int) -> None:
    p, _ = open_filled(browser, demo, width, f"layout-tree-{width}")
    try:
        # the reading that saw a branch (the tree is re-rendered as the demo runs)
        t = wait_for(
            lambda: (t := p.js(TREE_JS))["branches"] > 0 and t, timeout=30, what="a branch"
        )
        assert t["cut"] == [] and t["sideways"] <= 0, t
        # the count alone as text (digits: every font has them); the fork mark is a drawn box
        assert t["text"].isdigit()
        assert t["mark"]["w"] > 0 and t["mark"]["h"] > 0 and t["mark"]["border"] == "1px"
    finally:
        p.close()


HIST_LABELS_JS = """() => {
  // where uPlot drew the x labels of each histogram (its own layout), and how wide each text is
  const ctx = document.createElement('canvas').getContext('2d');
  const out = [];
  const charts = window.__bp.charts;
  for (const [name, plot] of Object.entries(charts.hists)) {
    const ax = plot.axes[0];
    ctx.font = ax.font[0] || ax.font;
    const splits = ax._splits || [];
    const vals = ax._values || [];
    const labels = [];
    splits.forEach((v, i) => {
      if (v === null || v === undefined || !vals[i]) return;
      const x = plot.valToPos(v, 'x');
      const w = ctx.measureText(vals[i]).width;
      labels.push([x - w / 2, x + w / 2, vals[i]]);
    });
    out.push({name, labels});
  }
  return out;
}"""


def test_histogram_axis_labels_keep_apart(browser: Any, demo: Server) -> None:
    p, _ = open_filled(browser, demo, 1000, "layout-hists")
    try:
        wait_for(
            lambda: p.js("() => window.__bp.model.histograms.lifetime.count") > 5,
            timeout=60,
            what="eviction samples",
        )
        wait_for(
            lambda: all(len(h["labels"]) >= 2 for h in p.js(HIST_LABELS_JS)[:2]),
            what="the histograms' axis labels",
        )
        for h in p.js(HIST_LABELS_JS):
            spans = sorted(h["labels"])
            for a, b in itertools.pairwise(spans):
                assert b[0] >= a[1] + 2, f"{h['name']}: {a[2]!r} and {b[2]!r} touch"
    finally:
        p.close()


RATES_JS = """() => {
  const s = window.__bp.charts.rates.series;
  return s.slice(1).map((x) => ({label: x.label, width: x.width, dash: x.dash || null}));
}"""


def test_alloc_and_evict_lines_stay_distinguishable(browser: Any, demo: Server) -> None:
    p = Page(browser, demo.url, "layout-rates", viewport={"width": 1280, "height": 800})
    try:
        alloc, evict = p.js(RATES_JS)
        assert (alloc["label"], evict["label"]) == ("alloc/s", "evict/s")
        # where both rates are equal, the dashed line on top leaves the wider solid one showing
        assert alloc["dash"] is None and evict["dash"] and len(evict["dash"]) == 2
        assert alloc["width"] > evict["width"]
    finally:
        p.close()


# ------------------------------------------------------------ fleet page


@pytest.fixture(scope="module")
def fleet() -> Iterator[str]:
    """An observer of a second demo server's KV events (the fleet page with data)."""
    pub_port, port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{pub_port}"
    pub = Server(
        free_port(), "--num-blocks", "2048", "--demo", "--log-level", "warning",
        "--kv-events-endpoint", endpoint, "--kv-events-bind", "bind", name="fleet-pool",
    )  # fmt: skip
    pub.start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "fleet-observer.log"
    try:
        proc = start_cli_observer(port, log, "--log-level", "warning", f"pool={endpoint}")
    except BaseException:
        pub.close()
        raise
    url = f"http://127.0.0.1:{port}"
    try:
        assert pub.post("/api/demo/start").status_code == 200

        def keys() -> int:
            assert proc.poll() is None, f"blockpool observe exited: see {log}"
            fleet = httpx.get(url + "/api/fleet", timeout=CLIENT_TIMEOUT).json()
            return int(fleet["instances"][0]["keys"])

        wait_for(keys, what="the observer to hold hashes")
        yield url
    finally:
        stop_cli_server(proc)
        pub.close()


WIDE_JS = """() => {
  const W = document.documentElement.clientWidth;
  const clipped = (e) => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX !== 'visible') return true;
    }
    return false;
  };
  return [...document.querySelectorAll('body *')]
    .filter((e) => e.getBoundingClientRect().right > W + 1 && !clipped(e))
    .slice(0, 6).map((e) => `${e.tagName}.${e.className}#${e.id}`);
}"""

FLEET_JS = """() => ({
  columns: getComputedStyle(document.querySelector('.fleet-layout'))
    .gridTemplateColumns.split(' ').length,
  rows: document.querySelectorAll('#hashmap tbody tr').length,
})"""


@pytest.mark.parametrize(("width", "columns"), [(1000, 2), (1280, 3)])
def test_fleet_page_reflows(browser: Any, fleet: str, width: int, columns: int) -> None:
    ctx = browser.new_context(viewport={"width": width, "height": 800})
    try:
        page = ctx.new_page()
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(fleet + "/")
        page.wait_for_selector("#instances .instance")
        page.wait_for_function("() => document.querySelectorAll('#hashmap tbody tr').length > 0")
        page.wait_for_selector("#tree li")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"layout-fleet-{width}.png"), full_page=True)
        got = page.evaluate(FLEET_JS)
        assert got["columns"] == columns
        side = layout.sideways(page)
        wide = page.evaluate(WIDE_JS)
        assert side["scrollWidth"] <= side["clientWidth"], (side, wide)
        # nor inside a panel (the hash map's table fits its panel)
        panels = page.evaluate(
            "() => [...document.querySelectorAll('.panel')]"
            ".filter((e) => e.scrollWidth > e.clientWidth + 1)"
            ".map((e) => (e.querySelector('h2') || e).textContent.trim().slice(0, 30))"
        )
        assert panels == [], panels
        # and the hash map's column heads show whole
        cut = page.evaluate(
            "() => [...document.querySelectorAll('#hashmap th')]"
            ".filter((e) => e.scrollWidth > e.clientWidth).map((e) => e.textContent)"
        )
        assert cut == [], cut
        assert layout.overlaps(page)["overlaps"] == []
        assert all(origin(u) == fleet for u in requests if not u.startswith("data:"))
    finally:
        ctx.close()
