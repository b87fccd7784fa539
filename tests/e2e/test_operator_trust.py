"""Numbers an operator can trust, in headless Chromium at 1600x1000,
1280x800 and 1000x800 (screenshots in test-artifacts/e2e/): every tile at a
recorded moment or a dash with the reason, the jump box's refusals, an idle
server's analysis, a reset that is not an eviction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Page, Server, free_port, wait_for
from tests.e2e.workload import quiesce_idle, start_demo

pytestmark = pytest.mark.browser

SIZES = [(1600, 1000), (1280, 800), (1000, 800)]
TILES = ("usage01", "hit1m", "hit5m", "hit", "waiting")

TILE_JS = """(keys) => Object.fromEntries(keys.map((k) => {
  const el = document.getElementById('stat-' + k);
  const tile = el.closest('.stat');
  return [k, {text: el.textContent, value: el.dataset.value, reason: tile.dataset.reason ?? null,
              label: tile.querySelector('.label').textContent}];
}))"""


def _scrub(p: Page, seq: int) -> None:
    p.js(
        """(seq) => { const el = document.getElementById('tl-slider');
                      el.value = String(seq); el.dispatchEvent(new Event('input')); }""",
        seq,
    )
    p.page.wait_for_function(
        "(seq) => document.getElementById('history-banner').dataset.seq === String(seq)"
        " && document.body.dataset.mode === 'history'",
        arg=seq,
    )


def _num(v: str | None) -> float | None:
    return None if v in (None, "null", "undefined") else float(v)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_tile_at_a_moment_and_the_jump_box(
    browser: Any, server: Server, size: tuple[int, int]
) -> None:
    w, h = size
    start_demo(server)
    p = Page(browser, server.url, f"trust-moment-{w}", viewport={"width": w, "height": h})
    try:
        # a moment a few seconds back, with the series' windows filled
        wait_for(
            lambda: p.js("() => window.__bp.history.info?.last_seq ?? 0") > 200,
            what="a recording",
        )
        info = server.get("/api/history")
        seq = (info["first_seq"] + info["last_seq"]) // 2
        _scrub(p, seq)
        st = server.get(f"/api/history/state?at={seq}&limit=1")
        t = st["tiles"]
        wait_for(
            lambda: _num(p.js(TILE_JS, list(TILES))["usage01"]["value"]) == st["summary"]["usage"],
            what="the tiles to show the moment",
        )
        shown = p.js(TILE_JS, list(TILES))
        assert shown["usage01"]["text"] == f"{st['summary']['usage']:.3f}"
        for key, field in (("hit1m", "hit_rate_1m"), ("hit5m", "hit_rate_5m"),
                           ("hit", "hit_rate_since"), ("waiting", "waiting")):  # fmt: skip
            if t[field] is None:
                assert shown[key]["text"] == "—" and shown[key]["reason"], (key, shown[key])
            else:
                assert _num(shown[key]["value"]) == t[field], (key, shown[key], t)
                assert shown[key]["reason"] is None
        assert shown["hit"]["label"] == (t["since_label"] or "since start")
        p.shot("-moment")
        # the jump box: an impossible clock time is refused on the page
        p.page.fill("#tl-jump", "99:99:99")
        p.page.press("#tl-jump", "Enter")
        err = p.page.get_attribute("#tl-jump", "data-error") or ""
        assert "not a time of day" in err and p.page.inner_text("#tl-at") == err
        assert p.js("() => document.getElementById('history-banner').dataset.seq") == str(seq)
        p.page.click("#tl-live")
        # the server's refusal of "abc" stays until corrected, through the polls
        p.page.fill("#tl-jump", "abc")
        p.page.press("#tl-jump", "Enter")
        p.page.wait_for_function(
            "() => (document.getElementById('tl-jump').dataset.error || '').startsWith('abc')"
        )
        err = p.page.get_attribute("#tl-jump", "data-error") or ""
        last = p.js("() => window.__bp.history.info.last_seq")
        for _ in range(2):  # two polls of /api/history later (the demo runs: it moved)
            wait_for(
                lambda last=last: p.js("() => window.__bp.history.info.last_seq") > last,
                what="a poll",
            )
            last = p.js("() => window.__bp.history.info.last_seq")
        assert p.page.inner_text("#tl-at") == err
        assert "bad" in (p.page.get_attribute("#tl-jump", "class") or "")
        p.shot("-jump-error")
        p.page.fill("#tl-jump", "")
        p.page.dispatch_event("#tl-jump", "input")
        wait_for(lambda: p.page.inner_text("#tl-at").startswith("live"), what="the error cleared")
        assert p.errors == []
    finally:
        p.close()


@pytest.fixture(scope="module")
def idle() -> Iterator[Server]:
    srv = Server(free_port(), "--num-blocks", "1024", "--log-level", "warning", name="idle")
    srv.start()
    yield srv
    srv.close()


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_an_idle_server_says_the_analysis_is_on(
    browser: Any, idle: Server, size: tuple[int, int]
) -> None:
    w, h = size
    assert idle.get("/api/history")["enabled"] is True
    p = Page(browser, idle.url, f"trust-idle-{w}", viewport={"width": w, "height": h})
    try:
        wait_for(
            lambda: p.page.inner_text("#h-analysis") == "on, waiting for operations",
            what="the analysis item",
        )
        assert p.js("() => document.body.dataset.analysis") == "on"
        assert p.page.is_visible("#timeline") and not p.page.is_visible("#analysis-off")
        p.shot()
        assert p.errors == []
    finally:
        p.close()


def test_a_reset_is_not_an_eviction_on_the_page(browser: Any, server: Server) -> None:
    """After stop-and-reset, the blocks readmitted miss as ``reset``: the
    regret count and the evicted misses do not move."""
    start_demo(server)
    wait_for(lambda: server.get("/api/summary")["blocks"]["cached"] > 50, what="cached blocks")
    quiesce_idle(server)
    before = server.get("/api/misses?limit=1")
    regrets = server.get("/api/regret?limit=1")["regrets_total"]
    assert server.post("/api/pool/reset").status_code == 200
    start_demo(server)
    wait_for(
        lambda: server.get("/api/misses?limit=1")["reasons"]["reset"]["blocks"] > 0,
        what="misses of reset blocks",
    )
    quiesce_idle(server)
    after = server.get("/api/misses?limit=1")
    assert after["evictions"]["by_cause"]["reset"] > before["evictions"]["by_cause"]["reset"]
    reg = server.get("/api/regret?limit=1")
    # the readmitted prompts were dropped by the reset: no regret from them
    # (evictions by reuse after the reset may add a few of their own)
    assert (
        reg["regrets_total"] - regrets
        <= after["reasons"]["evicted"]["blocks"] - before["reasons"]["evicted"]["blocks"]
    )
    p = Page(browser, server.url, "trust-reset", viewport={"width": 1600, "height": 1000})
    try:
        p.page.locator("#miss-panel").scroll_into_view_if_needed()
        wait_for(
            lambda: p.page.locator("#miss-panel", has_text="reset").count() > 0,
            what="the reset reason in the misses panel",
        )
        p.shot()
        assert p.errors == []
    finally:
        p.close()


def test_demo_drops_are_shown_on_the_page(browser: Any, server: Server) -> None:
    """A workload that outruns the pool drops its oldest arrivals: the page says how many."""
    before = server.get("/api/demo")
    assert server.post("/api/demo/config", {"rate": 400, "max_running": 1}).status_code == 200
    assert server.post("/api/demo/start").status_code == 200
    p = Page(browser, server.url, "trust-demo-drops", viewport={"width": 1280, "height": 800})
    try:
        wait_for(lambda: server.get("/api/demo")["stats"]["dropped_waiting"] > 0, what="drops")
        p.page.locator("#demo-status").scroll_into_view_if_needed()
        wait_for(lambda: p.page.is_visible("#demo-dropped"), what="the drops on the page")
        shown = int(p.page.inner_text("#demo-dropped").split()[0].replace(",", ""))
        assert 0 < shown <= server.get("/api/demo")["stats"]["dropped_waiting"]
        p.shot()
        assert p.errors == []
    finally:
        p.close()
        quiesce_idle(server)
        cfg = {"rate": before["rate"], "max_running": before["max_running"]}
        assert server.post("/api/demo/config", cfg).status_code == 200
