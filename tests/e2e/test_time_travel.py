"""Time travel in headless Chromium against a real server (4,096 blocks,
the demo, the recording): scrubbing the timeline draws every block as it
was recorded and going live draws the pool now; the diff between two
moments lists what REST lists, and the recording exports whole."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.e2e.conftest import Page, Server, wait_for
from tests.e2e.page_checks import region_shot, scrub
from tests.e2e.workload import admit, evict_everything, finish, quiet_moment
from tests.e2e.workload import quiesce_idle as quiesce

pytestmark = pytest.mark.browser

STATES = {"null": 0, "in_use": 1, "cached": 2, "empty": 3}

CELL_RGB_JS = """(ids) => {
  const map = window.__bp.map;
  const ctx = map.canvas.getContext('2d');
  return ids.map((id) => {
    const r = map.cellRect(id);
    const d = ctx.getImageData(Math.floor(r.x + r.w / 2), Math.floor(r.y + r.h / 2), 1, 1).data;
    return [d[0], d[1], d[2]];
  });
}"""


def expected_rgb(palette: dict[str, Any], state: int, ref: int) -> list[list[int]]:
    if state == 1:
        return [palette["in_use"][min(max(ref, 1), 4) - 1]]
    if state == 2:
        return [palette["cached"]]
    if state == 3:
        return [palette["empty"]]
    return [palette["null"]]


def test_scrubbing_shows_recorded_block_states_and_back_to_live(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    before = quiet_moment(server)
    # change many blocks: a big request in use now, not at `before`
    admit(server, random.Random(31).choices(range(32000), k=16 * 60), "an-scrub")
    wait_for(
        lambda: p.js("() => window.__bp.model.header.running_requests") == 1,
        what="the admit on the page",
    )
    wait_for(
        lambda: p.js("() => window.__bp.history.info?.last_seq ?? -1") > before,
        what="the timeline to reach past the admission",
    )
    scrub(p, before)
    p.frames()  # the canvas is repainted in a frame
    st = server.get(f"/api/history/state?at={before}&include_blocks=true&limit=1")
    assert st["at"]["seq"] == before
    hist_state = [STATES[s] for s in st["blocks"]["state"]]
    hist_ref = st["blocks"]["ref_cnt"]
    live_state = p.js("() => Array.from(window.__bp.model.state)")
    changed = [i for i in range(len(live_state)) if live_state[i] != hist_state[i]]
    assert len(changed) >= 30, "the request changed blocks since that moment"
    rng = random.Random(5)
    sample = sorted(set(rng.sample(changed, 20) + rng.sample(range(len(hist_state)), 20)))
    palette = p.js("() => window.__bp.palette.COLORS")
    got = p.js(CELL_RGB_JS, sample)
    for bid, rgb in zip(sample, got, strict=True):
        want = expected_rgb(palette, hist_state[bid], hist_ref[bid])
        assert rgb in want, f"block {bid} at op {before}: {st['blocks']['state'][bid]} drawn {rgb}"
    assert "HISTORY" in p.js("() => document.getElementById('history-banner').textContent")
    assert p.js("() => document.getElementById('tl-mode').textContent") == "history"
    # hovering shows the recorded block
    hover = p.js("(id) => window.__bp.history.hoverLine(id)", changed[0])
    assert hover.startswith(f"#{changed[0]} ·") and f"at op {before:,}" in hover
    p.shot("-history")
    # back to live: the map shows the pool now
    p.page.click("#tl-live")
    p.page.wait_for_function("() => document.body.dataset.mode !== 'history'")
    p.frames()
    assert not p.js("() => document.getElementById('history-banner').offsetParent")
    live_state = p.js("() => Array.from(window.__bp.model.state)")
    live_ref = p.js("() => Array.from(window.__bp.model.refCnt)")
    got = p.js(CELL_RGB_JS, sample)
    risk = palette["risk"]
    for bid, rgb in zip(sample, got, strict=True):
        want = expected_rgb(palette, live_state[bid], live_ref[bid])
        assert rgb in want or (live_state[bid] == 2 and rgb == risk), f"block {bid} live: {rgb}"
    assert p.js("() => window.__bp.map.live") is True
    finish(server, "an-scrub")
    assert p.errors == [], p.errors
    assert p.network == [], p.network


def test_diff_lists_match_rest_and_the_recording_exports(dashboard: Page, server: Server) -> None:
    p = dashboard
    quiesce(server)
    a = server.get("/api/history")["last_seq"]
    rng = random.Random(41)
    prompt = rng.choices(range(32000), k=16 * 6)
    admit(server, prompt, "an-diff-1")
    finish(server, "an-diff-1")
    evict_everything(server)  # its hashes go: "evicted" in the diff
    admit(server, rng.choices(range(32000), k=16 * 4 + 2), "an-diff-2")  # started, still running
    b = server.get("/api/history")["last_seq"]
    # A: jump to op `a` (the box under the map), mark it; B: the latest, from live
    wait_for(
        lambda: p.js("() => window.__bp.history.info?.last_seq ?? -1") >= b,
        what="the timeline to reach the latest op",
    )
    p.page.fill("#tl-jump", str(a))
    p.page.press("#tl-jump", "Enter")
    p.page.wait_for_function(
        "(seq) => document.getElementById('history-banner').dataset.seq === String(seq)", arg=a
    )
    p.page.click("#tl-a")
    p.page.click("#tl-live")
    p.page.click("#tl-b")
    p.page.wait_for_function(
        "(b) => document.getElementById('diff-to').value === String(b)"
        " && document.querySelectorAll('#diff-evicted tr:not(.empty)').length > 0",
        arg=b,
    )
    frm = int(p.js("() => document.getElementById('diff-from').value"))
    assert frm == a
    rest = server.get(f"/api/history/diff?from={a}&to={b}&limit=500")
    rows_js = """(id) => Array.from(document.querySelectorAll('#' + id + ' tr:not(.empty)'),
                   tr => [tr.dataset.hash, Number(tr.dataset.block)])"""
    evicted = p.js(rows_js, "diff-evicted")
    entered = p.js(rows_js, "diff-entered")
    assert evicted == [[e["hash64"], e["block_id"]] for e in rest["evicted"]]
    assert entered == [[e["hash64"], e["block_id"]] for e in rest["entered"]]
    assert len(evicted) >= 6, "the prompt's hashes were evicted"
    chips_js = """(id) => Array.from(document.querySelectorAll('#' + id + ' .chip'),
                    c => c.dataset.rid)"""
    assert p.js(chips_js, "diff-started") == rest["requests"]["started"]
    assert p.js(chips_js, "diff-ended") == rest["requests"]["ended"]
    assert "an-diff-2" in rest["requests"]["started"]
    assert f"{rest['ops']['total']:,} ops" in p.js(
        "() => document.getElementById('diff-summary').textContent"
    )
    # the markers on the timeline
    marks = p.js("() => Array.from(document.querySelectorAll('#tl-marks .mk'), m => m.title)")
    assert marks == [f"A: op {a}", f"B: op {b}"]
    region_shot(p, ".tt-panel", "diff")
    # export: the link downloads the recording as NDJSON
    href = p.js("() => document.getElementById('tt-export').getAttribute('href')")
    assert href == "/api/history/export"
    with server.http.stream("GET", href) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        assert "attachment" in resp.headers.get("content-disposition", "")
        first = json.loads(next(resp.iter_lines()))
    assert isinstance(first, dict)
    finish(server, "an-diff-2")
    assert p.errors == [], p.errors
    assert p.network == [], p.network
