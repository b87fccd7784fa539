"""Time travel moves everything: at a recorded moment the stat
tiles, the LRU queue and the block detail show that moment (from
GET /api/history/state), the charts mark it with a line, the panels that stay
live say so; the moment reads as a clock time with its op seq beside it; the
slider keeps its width; an error goes when going live."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.e2e.conftest import Page, Server, wait_for
from tests.e2e.page_checks import scrub
from tests.e2e.workload import quiet_moment

pytestmark = pytest.mark.browser

SHOWN_JS = """() => {
  const v = (k) => Number(document.getElementById('stat-' + k).dataset.value);
  const rows = [...document.querySelectorAll('#lru-body tr')].map((r) => Number(r.dataset.block));
  const line = document.querySelector('#chart-usage .moment-line');
  const after = (sel) => getComputedStyle(document.querySelector(sel), '::after').content;
  return {
    tiles: {in_use: v('in_use'), cached: v('cached'), empty: v('empty'), keys: v('keys'),
            requests: v('requests')},
    rows, count: document.getElementById('lru-count').textContent,
    line: line ? {hidden: line.hidden, ts: Number(line.dataset.ts)} : null,
    at: document.getElementById('tl-at').textContent,
    liveTag: after('.events-panel > .panel-head'),
    slider: document.getElementById('tl-slider').getBoundingClientRect().width,
  };
}"""


def test_a_recorded_moment_moves_tiles_queue_detail_and_charts(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    before = quiet_moment(server)
    # something big changes after `before`: a long request holds many blocks
    r = server.post(
        "/api/requests",
        {"token_ids": random.Random(7).choices(range(32000), k=16 * 40), "request_id": "hf-1"},
    )
    assert r.status_code == 201, r.text
    wait_for(lambda: p.js("() => window.__bp.model.header.running_requests") == 1)
    wait_for(lambda: p.js("() => window.__bp.history.info?.last_seq ?? -1") > before)
    width0 = p.js(SHOWN_JS)["slider"]
    scrub(p, before)
    st = server.get(f"/api/history/state?at={before}&include_blocks=true&limit=120")
    wait_for(lambda: p.js(SHOWN_JS)["tiles"]["in_use"] == st["summary"]["blocks"]["in_use"])
    got: dict[str, Any] = p.js(SHOWN_JS)
    b = st["summary"]["blocks"]
    assert got["tiles"] == {
        "in_use": b["in_use"],
        "cached": b["cached"],
        "empty": b["empty"],
        "keys": st["summary"]["hash_map_keys"],
        "requests": st["summary"]["running_requests"],
    }
    live_in_use = p.js("() => window.__bp.model.header.blocks.in_use")
    assert live_in_use != b["in_use"], "the tiles show the moment, not the pool now"
    # the queue is the recorded one
    assert got["rows"] == st["queue"]["block_ids"][: len(got["rows"])] and len(got["rows"]) > 10
    assert got["count"].startswith("recorded")
    # the charts mark the moment (when it is inside their window)
    assert got["line"] is not None and not got["line"]["hidden"]
    assert abs(got["line"]["ts"] - st["at"]["ts"]) < 1e-6
    # the clock first, the op seq beside it; the slider kept its width
    hh, mm, _rest = got["at"].split(":", 2)
    assert hh.isdigit() and mm.isdigit() and f"op {before:,}" in got["at"], got["at"]
    assert abs(got["slider"] - width0) <= 1, (got["slider"], width0)
    # the live panels say they are live
    assert "live" in got["liveTag"]
    # a click on a block: its recorded state in the detail panel
    changed = next(i for i, s in enumerate(st["blocks"]["state"]) if s != "in_use" and i > 0)
    xy = p.js("(id) => window.__bp.map.cellCenterPage(id)", changed)
    p.page.mouse.click(xy["x"], xy["y"])
    p.page.wait_for_function(
        "(id) => document.getElementById('detail-title').textContent.startsWith(`Block #${id} `)",
        arg=changed,
    )
    title = p.page.inner_text("#detail-title")
    assert f"at op {before:,}" in title
    assert p.page.inner_text("#detail-ref") == str(st["blocks"]["ref_cnt"][changed])
    p.shot("-moment")
    # back to live: the tiles and the queue follow the pool again
    p.page.click("#tl-live")
    wait_for(lambda: p.js(SHOWN_JS)["tiles"]["in_use"] == p.js(
        "() => window.__bp.model.header.blocks.in_use"))  # fmt: skip
    wait_for(lambda: not p.js(SHOWN_JS)["count"].startswith("recorded"), what="the live queue")
    assert p.js(SHOWN_JS)["line"]["hidden"] is True
    assert server.post("/api/requests/hf-1/finish").status_code == 200
    assert p.errors == []


def test_an_error_clears_when_going_live(dashboard: Page, server: Server) -> None:  # noqa: ARG001 fixture starts the server
    p = dashboard
    wait_for(lambda: p.js("() => !document.getElementById('tl-slider').disabled"))
    p.page.fill("#tl-jump", "not a moment")
    p.page.press("#tl-jump", "Enter")
    p.page.wait_for_function("() => document.getElementById('tl-jump').classList.contains('bad')")
    assert "not a moment" in p.page.inner_text("#tl-at")
    p.page.click("#tl-live")
    p.page.wait_for_function(
        "() => !document.getElementById('tl-jump').classList.contains('bad')"
        " && document.getElementById('tl-at').textContent.startsWith('live · ')"
    )
    assert p.errors == []
