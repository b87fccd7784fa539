"""Numbers an operator can trust, in headless Chromium at 1600x1000,
1280x800 and 1000x800 (screenshots in test-artifacts/e2e/): every tile at a
recorded moment or a dash with the reason, the jump box's refusals, an idle
server's analysis, a reset that is not an eviction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import ARTIFACTS, Page, Server, free_port, running, wait_for
from tests.e2e.page_checks import scrub
from tests.e2e.workload import quiesce_idle, start_demo

pytestmark = pytest.mark.browser

SIZES = [(1600, 1000), (1280, 800), (1000, 800)]
DEMO_RATE = 8.0  # the default demo: a busy machine still serves the pages quickly
TILES = ("usage01", "hit1m", "hit5m", "hit", "waiting")

TILE_JS = """(keys) => Object.fromEntries(keys.map((k) => {
  const el = document.getElementById('stat-' + k);
  const tile = el.closest('.stat');
  return [k, {text: el.textContent, value: el.dataset.value, reason: tile.dataset.reason ?? null,
              label: tile.querySelector('.label').textContent}];
}))"""


def _num(v: str | None) -> float | None:
    return None if v in (None, "null", "undefined") else float(v)  # type: ignore[arg-type]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_every_tile_at_a_moment_and_the_jump_box(
    browser: Any, server: Server, size: tuple[int, int]
) -> None:
    w, h = size
    p = Page(browser, server.url, f"trust-moment-{w}", viewport={"width": w, "height": h})
    try:
        start_demo(server, rate=DEMO_RATE)
        # a moment a few seconds back, with the series' windows filled
        wait_for(
            lambda: p.js("() => window.__bp.history.info?.last_seq ?? 0") > 200,
            what="a recording",
        )
        info = server.get("/api/history")
        seq = (info["first_seq"] + info["last_seq"]) // 2
        scrub(p, seq)
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
        server.post("/api/demo/stop")


@pytest.fixture(scope="module")
def idle() -> Iterator[Server]:
    with running("idle", "--num-blocks", "1024", "--log-level", "warning") as srv:
        yield srv


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
    start_demo(server, rate=DEMO_RATE)
    wait_for(lambda: server.get("/api/summary")["blocks"]["cached"] > 50, what="cached blocks")
    quiesce_idle(server)
    before = server.get("/api/misses?limit=1")
    regrets = server.get("/api/regret?limit=1")["regrets_total"]
    assert server.post("/api/pool/reset").status_code == 200
    start_demo(server, rate=DEMO_RATE)
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


TRACE = Path(__file__).resolve().parents[1] / "trace" / "data" / "mooncake_head50.jsonl"


def test_trace_replay_has_its_controls(browser: Any) -> None:
    srv = Server(
        free_port(), "--num-blocks", "100000", "--no-storage", "--trace", str(TRACE),
        "--trace-speed", "0.5", "--log-level", "warning", name="trust-trace",
    )  # fmt: skip
    srv.start()
    p = Page(browser, srv.url, "trust-trace-controls", viewport={"width": 1280, "height": 800})
    try:
        p.page.locator("#trace-ctl").scroll_into_view_if_needed()
        wait_for(lambda: p.page.is_visible("#trace-ctl"), what="the trace controls")
        if srv.get("/api/trace")["running"]:
            wait_for(lambda: p.page.is_enabled("#trace-stop"), what="stop offered")
            p.page.click("#trace-stop")
            wait_for(lambda: not srv.get("/api/trace")["running"], what="the replay to stop")
        wait_for(lambda: p.page.is_enabled("#trace-start"), what="start offered")
        p.page.click("#trace-start")
        wait_for(lambda: srv.get("/api/trace")["running"], what="the replay to start")
        wait_for(
            lambda: p.page.inner_text("#trace-status").startswith("running"), what="its status"
        )
        assert TRACE.name in p.page.inner_text("#trace-status")
        p.shot()
        assert p.errors == []
    finally:
        p.close()
        srv.close()


RECORD_STREAM_JS = """() => {
  window.__streamStates = [];
  new MutationObserver(() => {
    const s = document.body && document.body.dataset.stream;
    const last = window.__streamStates[window.__streamStates.length - 1];
    if (s && s !== last) window.__streamStates.push(s);
  }).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-stream']});
}"""


def test_first_load_is_not_an_error_and_small_things_read_right(browser: Any, idle: Server) -> None:
    """The first connection loads without the resync warning; an idle rates
    axis keeps its decimals; a KV event row reads "16 tok · who?"; a story
    panel clears while the next request loads."""
    from tests.e2e import hooks

    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    hooks.install(ctx)
    ctx.add_init_script(f"({RECORD_STREAM_JS})()")
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(idle.url + "/")
        page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=120_000)
        page.wait_for_function("() => document.body.dataset.stream === 'live'")
        states = page.evaluate("() => window.__streamStates")
        first_live = states.index("live")
        assert set(states[:first_live]) <= {"loading"}, states
        # an idle pool: the rates axis ticks differ (never "1, 1, 0")
        ticks = page.evaluate("() => window.__bp.charts.rates.axes[1]._values")
        assert ticks and len(set(ticks)) == len(ticks), ticks
        # a stored block: the event row names its tokens, then the link apart
        r = idle.post("/api/requests", {"token_ids": list(range(40)), "request_id": "rq-a"})
        assert r.status_code == 201, r.text
        assert (
            idle.post("/api/requests", {"token_ids": [7] * 20, "request_id": "rq-b"}).status_code
            == 201
        )
        page.wait_for_function("() => document.querySelector('[data-story-hash]')")
        row = page.evaluate(
            "() => document.querySelector('[data-story-hash]').closest('td').innerText"
        )
        assert row.endswith("tok · who?"), row
        # a story, then another: the first is gone while the second loads
        page.evaluate("() => window.__bp.requestView.show('rq-a')")
        page.wait_for_function("() => document.getElementById('rv-rid')?.textContent === 'rq-a'")
        page.route("**/api/requests/rq-b/story", lambda route: None)  # held: never answered  # noqa: ARG005 playwright's route handler signature
        page.evaluate("() => { window.__bp.requestView.show('rq-b'); }")
        page.wait_for_function(
            "() => document.getElementById('request-view').dataset.state === 'loading'"
        )
        assert page.evaluate("() => document.getElementById('rv-rid')") is None
        assert page.inner_text("#rv-loading") == "loading rq-b…"
        page.unroute("**/api/requests/rq-b/story")
        page.screenshot(path=str(ARTIFACTS / "trust-small-things.png"), full_page=True)
        for rid in ("rq-a", "rq-b"):
            assert idle.post(f"/api/requests/{rid}/finish").status_code == 200
        assert errors == []
    finally:
        ctx.close()


LEGIBLE_JS = """() => {
  const bar = document.querySelector('.topbar').getBoundingClientRect();
  const hists = [...document.querySelectorAll('.hist')].map((e) => e.getBoundingClientRect().width);
  const cut = [...document.querySelectorAll('.hist-title, .panel-head h2, #stats .stat .label')]
    .filter((e) => e.getClientRects().length && e.scrollWidth > e.clientWidth + 1)
    .map((e) => e.textContent.trim());
  const items = [...document.querySelectorAll('#health .hitem')]
    .filter((e) => e.getClientRects().length);
  const health = document.getElementById('health');
  return {bar: bar.height, hists, cut, healthCut: health.scrollWidth > health.clientWidth + 1,
          items: items.map((e) => e.dataset.h)};
}"""


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_legible_at_every_size(browser: Any, server: Server, size: tuple[int, int]) -> None:
    """One-row top bar; histograms wide enough for their titles and labels;
    no clipped panel title or tile label."""
    w, h = size
    p = Page(browser, server.url, f"trust-legible-{w}", viewport={"width": w, "height": h})
    try:
        start_demo(server, rate=DEMO_RATE)
        wait_for(lambda: p.js("() => window.__bp.model.points.length") > 5, what="points")
        got = p.js(LEGIBLE_JS)
        assert got["bar"] <= 44, got  # one row (a wrapped bar was ~105 px at 1000)
        assert not got["healthCut"], got
        assert {"state", "seq", "lag", "drops", "resyncs", "analysis"} <= set(got["items"]), got
        assert len(got["hists"]) == 3 and min(got["hists"]) >= 240, got["hists"]
        assert got["cut"] == [], got["cut"]
        p.shot()
        assert p.errors == []
    finally:
        p.close()
        server.post("/api/demo/stop")
