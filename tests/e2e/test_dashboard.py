"""The dashboard in headless Chromium against a real server.

One server (4,096 blocks, demo workload) serves the module (the restart and
token tests, with servers of their own, are in test_reconnect.py).  Each
test opens a fresh tab; a screenshot of it lands in
test-artifacts/e2e/<test>.png.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.e2e.conftest import Page, Server, wait_for
from tests.e2e.page_checks import PAGE_STATS_JS, rest_stats, wait_page_agrees
from tests.e2e.workload import admit, quiesce, run_demo, start_demo

pytestmark = pytest.mark.browser

STATE_NAMES = ["null", "in_use", "cached", "empty"]

SAMPLE_CELLS_JS = """() => {
  const bp = window.__bp, map = bp.map, m = bp.model;
  const w = map.canvas.width;
  const data = map.canvas.getContext('2d').getImageData(0, 0, w, map.canvas.height).data;
  const cells = [];
  for (let id = 0; id < m.n; id++) {
    const r = map.cellRect(id);
    const x = Math.floor(r.x + r.w / 2), y = Math.floor(r.y + r.h / 2);
    const o = (y * w + x) * 4;
    cells.push([m.state[id], m.refCnt[id], data[o], data[o + 1], data[o + 2]]);
  }
  return {seq: m.seq, cells, palette: bp.palette.COLORS, cellPx: map.k * map.effScale};
}"""

# ----------------------------------------------------------------- tests


def test_page_loads_live_without_console_errors(dashboard: Page, server: Server) -> None:
    p = dashboard
    start_demo(server, rate=10)
    wait_for(lambda: p.js("() => document.getElementById('h-state').textContent") == "live")
    seq0 = p.js("() => window.__bp.model.seq")
    raf0 = p.js("() => window.__bp.perf.raf")
    info_js = """() => ({seq: __bp.model.seq, n: __bp.model.n, raf: __bp.perf.raf,
                  facts: document.getElementById('facts').textContent,
                  events: document.querySelectorAll('#ev-body tr').length,
                  lru: document.querySelectorAll('#lru-body tr').length,
                  charts: document.querySelectorAll('.chart > .uplot').length})"""

    def live() -> Any:
        # deltas keep coming (20 Hz), the page keeps drawing, every panel filled:
        # waited on as conditions, with a deadline generous for a busy machine
        info = p.js(info_js)
        done = (
            info["seq"] > seq0 + 10 and info["raf"] >= raf0 + 5
            and info["events"] > 0 and info["lru"] > 0 and info["charts"] == 6
        )  # fmt: skip
        return info if done else None

    info = wait_for(live, 60, "deltas, frames and every panel")
    assert info["n"] == 4096
    assert "4,096 blocks" in info["facts"]
    p.shot("-overview")
    assert p.errors == [], p.errors
    assert p.network == [], p.network


def test_canvas_pixels_show_each_blocks_state(dashboard: Page, server: Server) -> None:
    p = dashboard
    run_demo(server)
    admit(server, random.Random(1).choices(range(32000), k=200), rid="e2e-canvas")
    quiesce(server)
    # the hand-admitted request stays: blocks in use, cached and empty all exist
    wait_page_agrees(p, server)
    p.frames()  # the canvas is repainted in a frame
    got = p.js(SAMPLE_CELLS_JS)
    pal = got["palette"]
    assert got["cellPx"] >= 4, "4,096 blocks get cells of several pixels"
    counts = [0, 0, 0, 0]
    for bid, (state, ref, r, g, b) in enumerate(got["cells"]):
        rgb = [r, g, b]
        counts[state] += 1
        if state == 1:
            want = [pal["in_use"][min(max(ref, 1), 4) - 1]]
        elif state == 2:
            want = [pal["cached"], pal["risk"]]
        elif state == 3:
            want = [pal["empty"]]
        else:
            want = [pal["null"]]
        assert rgb in want, f"block {bid}: state {STATE_NAMES[state]} ref {ref} drawn as {rgb}"
    summary = rest_stats(server)
    assert counts[1:] == [summary["in_use"], summary["cached"], summary["empty"]]
    assert counts[1] > 0 and counts[2] > 0 and counts[3] > 0
    # the page's states are the server's (a sample of blocks through REST)
    states = p.js("() => Array.from(window.__bp.model.state)")
    refs = p.js("() => Array.from(window.__bp.model.refCnt)")
    for bid in random.Random(2).sample(range(4096), 40):
        blk = server.get(f"/api/blocks/{bid}")
        assert blk["state"] == STATE_NAMES[states[bid]], bid
        assert blk["ref_cnt"] == refs[bid], bid
    assert server.post("/api/requests/e2e-canvas/finish").status_code == 200
    assert p.errors == []


def test_numbers_move_with_the_workload_and_agree_with_summary(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    start_demo(server, rate=20)
    first = p.js(PAGE_STATS_JS)
    ev0 = p.js("() => window.__bp.model.header.events_last_seq")
    seen: set[tuple[int, ...]] = set()
    wait_for(
        lambda: (seen.add(tuple(p.js(PAGE_STATS_JS).values())), len(seen) > 3)[1],
        what="the numbers on the page to move with the demo",
    )
    assert p.js("() => window.__bp.model.header.events_last_seq") > ev0
    top = p.js("() => Number(document.querySelector('#ev-body tr td').textContent)")
    assert top > ev0, "the event log shows new events with their seqs"
    quiesce(server)
    final = wait_page_agrees(p, server)
    assert final != first or final["keys"] > 0
    shown = p.js("() => document.getElementById('stat-in_use').textContent")
    assert shown.startswith(f"{final['in_use']:,}")
    assert p.errors == []


def test_click_block_shows_rest_details_and_highlights(dashboard: Page, server: Server) -> None:
    p = dashboard
    quiesce(server)
    tokens = random.Random(3).choices(range(32000), k=16 * 6 + 5)  # 7 blocks
    res = admit(server, tokens, rid="e2e-click")
    ids = res["block_ids"][0]
    bid = ids[2]
    wait_for(lambda: p.js("(id) => window.__bp.model.refCnt[id]", bid) == 1, what="the admit")
    xy = p.js("(id) => window.__bp.map.cellCenterPage(id)", bid)
    p.page.mouse.click(xy["x"], xy["y"])
    p.page.wait_for_function(
        "() => document.getElementById('detail-holders')?.textContent.includes('e2e-click')"
    )
    blk = server.get(f"/api/blocks/{bid}")
    detail = p.js(
        """() => ({title: document.getElementById('detail-title').textContent,
                  state: document.getElementById('detail-state').textContent,
                  ref: document.getElementById('detail-ref').textContent,
                  hash: document.getElementById('detail-hash').textContent,
                  qpos: document.getElementById('detail-qpos').textContent,
                  lifetime: document.getElementById('detail-metrics').textContent})"""
    )
    assert detail["title"].startswith(f"Block #{bid}")
    assert detail["state"] == "in use" and blk["state"] == "in_use"
    assert detail["ref"] == str(blk["ref_cnt"])
    assert detail["hash"] == blk["hash64"]
    assert "not free" in detail["qpos"]
    assert detail["lifetime"] == ("not sampled" if blk["metrics"] is None else detail["lifetime"])
    # every block of the same request is highlighted
    p.page.wait_for_function(
        "(n) => window.__bp.map.hl.request.length === n", arg=len([i for i in ids if i])
    )
    hl = p.js("() => window.__bp.map.hl.request.slice().sort((a, b) => a - b)")
    assert hl == sorted(i for i in ids if i)
    assert p.js("() => window.__bp.map.hl.selected") == bid
    p.shot("-selected")
    # a free (cached) block shows its queue position and time to eviction
    assert server.post("/api/requests/e2e-click/finish").status_code == 200
    q = server.get("/api/queue?limit=10000")
    cached = [it for it in q["items"] if it["cached"]]
    target = cached[-1]
    wait_for(lambda: p.js("(id) => window.__bp.model.state[id]", target["block_id"]) == 2)
    xy = p.js("(id) => window.__bp.map.cellCenterPage(id)", target["block_id"])
    p.page.keyboard.press("Escape")
    p.page.mouse.click(xy["x"], xy["y"])
    p.page.wait_for_function(
        "(id) => document.getElementById('detail-title').textContent.startsWith('Block #' + id)",
        arg=target["block_id"],
    )
    wait_for(
        lambda: p.js("() => document.getElementById('detail-qpos').textContent").startswith(
            f"{target['position']:,} "
        ),
        what="the queue position from REST",
    )
    assert p.errors == []


def test_lru_queue_order_matches_the_server(dashboard: Page, server: Server) -> None:
    p = dashboard
    run_demo(server)
    quiesce(server)
    wait_page_agrees(p, server)
    rest = [it["block_id"] for it in server.get("/api/queue?limit=10000")["items"]]
    assert rest == p.js("() => window.__bp.model.queueOrder()"), "stamps give the LRU order"
    lru_rows = (
        "() => Array.from(document.querySelectorAll('#lru-body tr td:nth-child(2)'))"
        ".map(td => Number(td.textContent.slice(1)))"
    )
    # the panel refreshes at 2 Hz
    free_js = "() => document.getElementById('lru-free').textContent"
    rows = wait_for(
        lambda: (r := p.js(lru_rows)) and r == rest[: len(r)] and len(r) >= 50 and r,
        what="the LRU panel to show the server's queue head",
    )
    assert rows == rest[: len(rows)]
    wait_for(lambda: p.js(free_js) == f"{len(rest):,}", what="the free count")
    assert p.errors == []


def test_gap_is_resumed_and_the_model_stays_exact(dashboard: Page, server: Server) -> None:
    p = dashboard
    start_demo(server, rate=20)
    p.js("() => { window.__bp.conn.dropNext = 3; }")
    wait_for(lambda: p.js("() => window.__bp.conn.health.gapsResumed") >= 1, what="a gap")
    seq = p.js("() => window.__bp.model.seq")
    wait_for(lambda: p.js("() => window.__bp.model.seq") > seq + 10, what="deltas after resume")
    quiesce(server)
    wait_page_agrees(p, server)
    rest = [it["block_id"] for it in server.get("/api/queue?limit=10000")["items"]]
    assert rest == p.js("() => window.__bp.model.queueOrder()")
    assert p.js("() => window.__bp.conn.health.resyncs") == 0, "resumed from the ring"
    assert p.js("() => document.getElementById('h-gaps').textContent") != "0"
    assert p.errors == []


def test_hash_map_search_multi_copies_and_prefix_tree(dashboard: Page, server: Server) -> None:
    p = dashboard
    quiesce(server)
    rng = random.Random(4)
    shared = rng.choices(range(32000), k=16 * 4)
    a = admit(server, shared + rng.choices(range(32000), k=40), rid="e2e-a")
    admit(server, shared + rng.choices(range(32000), k=40), rid="e2e-b")
    # a prompt of whole blocks: its last block is recomputed -> a second copy
    admit(server, shared, rid="e2e-c")
    blk = server.get(f"/api/blocks/{a['block_ids'][0][3]}")
    assert blk["copies_under_hash"] == 2
    h64 = blk["hash64"]
    p.page.fill("#hm-search", h64[:10])
    p.page.wait_for_function(
        "(h) => Array.from(document.querySelectorAll('#hm-body tr.multi td:first-child'))"
        ".some(td => td.textContent === h)",
        arg=h64,
        timeout=30_000,  # a deadline: the hash map panel refreshes every second
    )
    row = p.js(
        """(h) => { const tr = Array.from(document.querySelectorAll('#hm-body tr'))
                     .find(t => t.cells[0].textContent === h);
                   return {copies: tr.cells[2].textContent, ids: tr.cells[3].textContent}; }""",
        h64,
    )
    hm = server.get(f"/api/hashmap?hash={h64}")
    assert row["copies"] == "2"
    for bid in hm["items"][0]["block_ids"]:
        assert f"#{bid}" in row["ids"]
    # the prefix tree: the shared 4-block chain branches into the two requests
    root = server.get(f"/api/blocks/{a['block_ids'][0][0]}")["hash64"]
    p.page.wait_for_function(
        """(h) => { const f = window.__bp.treePanel.lastBuild;
                    const r = f && f.nodes.get(h); return r && r.size >= 8; }""",
        arg=root,
        timeout=30_000,  # a deadline: the tree is rebuilt every two seconds
    )
    tree = p.js(
        """(h) => { let n = window.__bp.treePanel.lastBuild.nodes.get(h), depth = 1;
                    while (n.children.length === 1) { n = n.children[0]; depth++; }
                    const tags = [...document.querySelectorAll('#tree-body .tag.branch')];
                    return {depth, branches: n.children.length, parent: n.parent,
                            tags: tags.map((t) => t.textContent)}; }""",
        root,
    )
    assert tree["depth"] == 4 and tree["branches"] == 2, tree
    assert "2" in tree["tags"]  # the branch mark (drawn with CSS) and its count
    p.shot("-hashmap")
    for rid in ("e2e-a", "e2e-b", "e2e-c"):
        assert server.post(f"/api/requests/{rid}/finish").status_code == 200
    assert p.errors == []


def test_reset_refused_while_held_then_done(dashboard: Page, server: Server) -> None:
    p = dashboard
    quiesce(server)
    wait_page_agrees(p, server)
    # admit by hand from the page
    p.page.fill("#admit-tokens", "0..99")
    p.page.click("#admit-btn")
    p.page.wait_for_selector("#admit-rid")
    rid = p.js("() => document.getElementById('admit-rid').textContent")
    assert rid in [r["request_id"] for r in server.get("/api/requests")["items"]]
    held = 4096 - 1 - server.get("/api/summary")["num_free_blocks"]
    assert held > 0
    # the dialog is built from the stream's counts: wait until the page has them
    wait_page_agrees(p, server)
    # reset: the dialog says beforehand it will be refused, and offers to stop the workload
    p.page.click("#reset-btn")
    assert p.page.is_visible("#reset-dialog")
    assert "refuses" in p.page.inner_text("#reset-facts")
    assert p.page.is_visible("#reset-stop")
    p.page.click("#reset-confirm")
    # the refusal shows in the dialog (and in the controls' line), with the held-block count
    p.page.wait_for_selector("#reset-outcome.refused")
    assert p.page.is_visible("#reset-outcome")
    held_shown = p.js("() => document.querySelector('#reset-outcome .reset-held').textContent")
    assert held_shown == str(held)
    assert "Reset refused" in p.page.inner_text("#reset-outcome")
    assert "Reset refused" in p.js("() => document.getElementById('ctl-result').textContent")
    p.shot("-refused")
    p.page.click("#reset-close")
    assert not p.page.is_visible("#reset-dialog")
    # finish it from the page, then reset for real
    p.page.wait_for_selector(f'button[data-finish="{rid}"]')  # polled every 2 s
    p.page.click(f'button[data-finish="{rid}"]')
    wait_for(lambda: server.get("/api/summary")["running_requests"] == 0, what="the finish")
    wait_page_agrees(p, server)
    assert server.get("/api/summary")["blocks"]["cached"] > 0
    p.page.click("#reset-btn")
    assert not p.page.is_visible("#reset-stop")
    p.page.click("#reset-confirm")
    p.page.wait_for_selector("#reset-outcome.ok")
    assert "Reset done" in p.page.inner_text("#reset-outcome")
    p.page.click("#reset-close")
    stats = wait_page_agrees(p, server)
    assert stats["cached"] == 0 and stats["keys"] == 0 and stats["empty"] == 4095
    p.frames()
    cells = p.js(SAMPLE_CELLS_JS)
    pal = cells["palette"]
    assert all([r, g, b] in (pal["empty"], pal["null"]) for _, _, r, g, b in cells["cells"])
    assert p.errors == []
    assert len(p.network) == 1 and "409" in p.network[0], p.network  # the refused reset


def test_events_filter_and_pause(dashboard: Page, server: Server) -> None:
    p = dashboard
    start_demo(server, rate=20)
    wait_for(lambda: p.js("() => document.querySelectorAll('#ev-body tr').length") > 20)
    p.page.click("#ev-pause")
    # the first paused render says so and draws the table as it stands
    wait_for(lambda: "paused" in p.js("() => document.getElementById('ev-status').textContent"))
    frozen = p.js("() => document.getElementById('ev-body').textContent")
    # events keep arriving (the log's status counts them) and the table stays as it was
    wait_for(
        lambda: (
            int(
                p.js("() => document.getElementById('ev-status').textContent")
                .split("·")[-1]
                .split()[0]
                .replace(",", "")
            )
            >= 10
        ),
        what="new events counted while paused",
    )
    assert p.js("() => document.getElementById('ev-body').textContent") == frozen
    assert "paused" in p.js("() => document.getElementById('ev-status').textContent")
    p.page.click("#ev-pause")
    wait_for(
        lambda: p.js("() => document.getElementById('ev-body').textContent") != frozen,
        what="the log to move again",
    )
    p.page.uncheck('[data-evtype="0"]')
    kinds_js = (
        "() => Array.from(document.querySelectorAll('#ev-body tr:not(.gap) td:nth-child(2)'))"
        ".map(td => td.textContent)"
    )
    kinds = wait_for(
        lambda: (k := p.js(kinds_js)) and set(k) <= {"BlockRemoved", "AllBlocksCleared"} and k,
        timeout=120,  # a deadline: removals start once the demo has cycled the pool
        what="only removals in the log",
    )
    assert kinds
    p.page.check('[data-evtype="0"]')
    # filter by a hash: only events naming it
    h = p.js("() => window.__bp.model.events.filter(e => e[1] === 0).at(-1)[2][0].slice(-16)")
    p.page.fill("#ev-hash", h[:8])
    rows_js = "() => Array.from(document.querySelectorAll('#ev-body tr')).map(tr => tr.textContent)"
    texts = wait_for(
        lambda: (t := p.js(rows_js)) and all(h[:8] in x for x in t) and t,
        what="only events naming the hash",
    )
    assert texts
    quiesce(server)
    assert p.errors == []
