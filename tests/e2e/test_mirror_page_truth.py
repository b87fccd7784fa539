"""The dashboard true on a mirror (issue 29, items 7-10 and the page walk),
at 1600, 1280 and 1000 px.

An engine followed as the plugin follows vLLM's pool, its batches sent by
the plugin's own sender thread, the real app mirroring it
(tests/e2e/mirror_page.py).  Each figure is checked against the engine's
own: the evicted-miss charts against the requests' stories, a story looked
up by the client's id, the unknowns said with their reason, the whole page
stale when the engine goes silent, and a walk over every tile and chart
that fails on a default standing for an unknown.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from blockpool.mirror.protocol import Arrive, DigestReading, Finished, Scheduled
from tests.e2e.conftest import Page, wait_for
from tests.e2e.mirror_page import Mirrored, mirrored, walk_values
from tests.mirror.workload import BLOCK
from tests.support.wait import CLIENT_TIMEOUT

pytestmark = pytest.mark.browser

WIDTHS = (1600, 1280, 1000)

# vLLM's internal ids of client requests (see app/mirror/story.py):
# {k}_ before a sample's id when n > 1, -{prompt} and 8 hex characters after the client's id
TOLD = {
    "cmpl-7f3e-0-a7acb6a5": 2 * BLOCK,  # one prompt, n = 1
    "0_chatcmpl-55aa-0c1d2e3f": BLOCK,  # n = 2: two samples of one client request
    "1_chatcmpl-55aa-0c1d2e3f": 0,
}


def _tell_client_ids(m: Mirrored) -> None:
    """Requests under vLLM-shaped ids (told, scheduled and finished, as the plugin would)."""
    engine = m.engine
    rid0 = next(iter(engine.rt.manager.requests))
    hashes = [bytes(h) for h in engine.rt.manager.requests[rid0].block_hashes]
    n = len(hashes) * BLOCK + 1
    now = time.time()
    for i, (rid, hit) in enumerate(TOLD.items()):
        engine.follower.request(Arrive(rid, now + i, n, hashes))
        engine.follower.request(Scheduled(rid, now + i, hit))
        engine.follower.request(Finished(rid, now + i + 1, n + 3))
    engine.follower.flush()
    wait_for(lambda: all(r in m.client.book.requests for r in TOLD), what="the ids told")


@pytest.fixture(scope="module")
def mirror() -> Iterator[Mirrored]:
    with mirrored() as m:
        m.drive(400)
        _tell_client_ids(m)
        m.drive(20)
        for _ in range(500):  # end with requests running (the walk compares them)
            if len(m.engine.rt.manager.requests) >= 2:
                break
            m.drive(1)
        yield m


def _page(browser: Any, m: Mirrored, name: str, width: int) -> Page:
    p = Page(browser, m.server.url, name, viewport={"width": width, "height": 1000})
    wait_for(lambda: p.js("() => document.body.dataset.mirror") == "1", what="the page a mirror's")
    return p


def _rest(m: Mirrored, path: str) -> Any:
    r = httpx.get(m.server.url + path, timeout=CLIENT_TIMEOUT)
    r.raise_for_status()
    return r.json()


def _evicted_in_stories(m: Mirrored) -> list[float]:
    """Every evicted prompt block's age, from the stories (the same source as the charts)."""
    ages: list[float] = []
    for rid in list(m.client.book.requests):
        for b in _rest(m, f"/api/requests/{rid}/story")["blocks"]:
            d = b["detail"] or {}
            if b["reason"] == "evicted" and "evicted_ago_seconds" in d:
                ages.append(d["evicted_ago_seconds"])
    return ages


# -------------------------------------------------------------- item 7


@pytest.mark.parametrize("width", WIDTHS)
def test_the_evicted_miss_charts_show_the_stories_evictions(
    browser: Any, mirror: Mirrored, width: int
) -> None:
    ages = _evicted_in_stories(mirror)
    assert len(ages) >= 5, ages  # the workload evicts blocks prompts then miss
    p = _page(browser, mirror, f"mirror-truth-misscharts-{width}", width)
    try:
        shown = wait_for(
            lambda: (
                (
                    g := p.js(
                        """() => { const m = window.__bp.panels.misses;
                          const sum = (c) => (c.ys[0] || []).reduce((a, v) => a + (v || 0), 0);
                          return {ago: sum(m.ago.chart), pos: sum(m.pos.chart),
                            agoEmpty: !m.ago.chart.emptyEl.hidden,
                            posEmpty: !m.pos.chart.emptyEl.hidden,
                            agoTitle: document.getElementById('miss-ago-title').textContent,
                            posTitle: document.getElementById('miss-pos-title').textContent}; }"""
                    )
                )["ago"]
                > 0
                and g
            ),
            what="the age chart drawn",
        )
        rest = _rest(mirror, "/api/misses")["evicted_misses"]
        # one bar count per evicted block of the stories: the charts and the stories agree
        assert shown["ago"] == rest["ago_seconds"]["count"] == len(ages), (shown, len(ages))
        assert shown["pos"] == rest["queue_position_when_freed"]["count"] > 0, shown
        assert not shown["agoEmpty"] and not shown["posEmpty"], shown
        assert "none yet" not in shown["agoTitle"] + shown["posTitle"], shown
        assert shown["agoTitle"].startswith("age p50") and "queue pos. p50" in shown["posTitle"]
        p.shot()
        assert p.errors == [], p.errors
    finally:
        p.close()


# -------------------------------------------------------------- item 8


@pytest.mark.parametrize("width", WIDTHS)
def test_a_story_by_the_clients_id_on_the_page(browser: Any, mirror: Mirrored, width: int) -> None:
    p = _page(browser, mirror, f"mirror-truth-clientid-{width}", width)
    try:

        def search(rid: str) -> None:
            p.page.fill("#rv-id", rid)
            p.page.press("#rv-id", "Enter")

        search("cmpl-7f3e")
        wait_for(
            lambda: (
                p.js("() => document.getElementById('rv-rid')?.textContent")
                == "cmpl-7f3e-0-a7acb6a5"
            ),
            what="the story of the client's id",
        )
        fam = p.js("() => document.getElementById('rv-family').textContent")
        assert "cmpl-7f3e" in fam and "cmpl-7f3e-0-a7acb6a5" in fam, fam
        hits = p.js("() => document.getElementById('rv-hits').textContent")
        assert hits == f"hit 2 blocks ({2 * BLOCK} tokens)", hits
        # n = 2: both samples named; the second's story one click away
        search("chatcmpl-55aa")
        wait_for(
            lambda: (
                p.js("() => document.getElementById('rv-rid')?.textContent")
                == "0_chatcmpl-55aa-0c1d2e3f"
            ),
            what="the first sample's story",
        )
        ids = p.js(
            "() => [...document.querySelectorAll('#rv-family [data-engine-id]')]"
            ".map((e) => e.dataset.engineId)"
        )
        assert ids == ["0_chatcmpl-55aa-0c1d2e3f", "1_chatcmpl-55aa-0c1d2e3f"], ids
        p.page.click("#rv-family button[data-engine-id='1_chatcmpl-55aa-0c1d2e3f']")
        wait_for(
            lambda: (
                p.js("() => document.getElementById('rv-rid')?.textContent")
                == "1_chatcmpl-55aa-0c1d2e3f"
            ),
            what="the second sample's story",
        )
        assert p.js("() => document.getElementById('rv-state').textContent") == "finished"
        assert "(2, one per sample)" in p.js(
            "() => document.getElementById('rv-family').textContent"
        )
        # decode steps are not told by the plugin: not known, never "—" as if none
        decode = p.js(
            """() => [...document.querySelectorAll(
                '#rv-times tr[data-time$=decode] [data-unknown]')]
              .map((e) => [e.textContent, e.title])"""
        )
        assert len(decode) == 2 and all(t == "not known on a mirror" for t, _ in decode), decode
        assert all("decode steps" in why for _, why in decode), decode
        # an id nobody was told of: the server's 404 in words
        search("cmpl-nobody")
        wait_for(
            lambda: (
                "by vLLM's id or the client's"
                in (p.js("() => document.getElementById('rv-error')?.textContent") or "")
            ),
            what="the 404 said",
        )
        p.shot()
        assert p.errors == [], p.errors
    finally:
        p.close()


# -------------------------------------------------------------- item 10


LABELS_JS = """() => {
  const facts = document.getElementById('facts');
  const fr = facts.getBoundingClientRect();
  const health = document.getElementById('health');
  const lagItem = document.querySelector('#health [data-h=lag]');
  const mirror = document.querySelector('[data-h=mirror]');
  const tile = (k) => { const t = document.querySelector(`.stat[data-stat=${k}]`);
    return {text: t.querySelector('.value').textContent, reason: t.dataset.reason || '',
            title: t.title}; };
  const note = document.getElementById('tokens-note');
  const legend = [...document.querySelectorAll('#chart-tokens .mc-item')].map((e) =>
    ({text: e.textContent, unknown: e.dataset.unknown || '', title: e.title}));
  return {
    facts: facts.textContent, factsCut: facts.scrollWidth > facts.clientWidth + 1 ||
      fr.right > window.innerWidth || fr.height === 0,
    healthCut: health.scrollWidth > health.clientWidth + 1,
    lagLabel: lagItem.querySelector('i').textContent,
    lagTitle: lagItem.title + lagItem.querySelector('b').title,
    mirrorText: mirror.textContent, mirrorTitle: mirror.title,
    running: tile('requests'), waiting: tile('waiting'),
    note: note.textContent, noteTitle: note.title, legend,
  };
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_unknowns_are_said_and_the_lags_labelled(
    browser: Any, mirror: Mirrored, width: int
) -> None:
    p = _page(browser, mirror, f"mirror-truth-unknowns-{width}", width)
    try:
        got = wait_for(
            lambda: (g := p.js(LABELS_JS))["mirrorText"].find("exact") >= 0 and g["note"] and g,
            what="the mirror item and the token note",
        )
        # the pool's description whole
        assert "64 blocks \u00d7 4 tok · sha256 · 1 group · caching on" in got["facts"], got
        assert not got["factsCut"], got
        assert not got["healthCut"], got
        # three lags, each saying what it measures
        assert got["lagLabel"] == "frame lag" and "server's tick" in got["lagTitle"], got
        assert "applied" in got["mirrorText"], got
        assert "applied: the engine's step to the mirror's pool" in got["mirrorTitle"], got
        assert "page: the engine's step to this page" in got["mirrorTitle"], got
        # a clean start: joining the engine is no resync
        assert "resyncs 0 (after the first sync)" in got["mirrorTitle"], got
        # the digest's progress: this engine's plugin says none (read on its own
        # thread) -- said so; then one starved of forward passes says why
        if mirror.client.status.engine_reading is None:  # (the module's first page)
            assert "engine's digest progress: not said by the plugin" in got["mirrorTitle"], got
        mirror.rig.reading = DigestReading(
            behind=321,
            sweep_left=None,
            window_us=40.0,
            discarded=4,
            stopped=12,
            overrun=1,
            planned_too_long=2,
        )
        try:
            title = wait_for(
                lambda: (t := p.js(LABELS_JS)["mirrorTitle"]).find("321 blocks behind") >= 0 and t,
                what="the digest's progress in the mirror item's title",
            )
        finally:
            mirror.rig.reading = None
        assert (
            "engine's digest: 321 blocks behind, 0 taken, 4 readings thrown away (the engine "
            "moved during them), 1 of them still running when the engine came back, 12 stopped "
            "in time (kept) · the engine's shortest forward pass 0.04ms (the plugin reads its "
            "pool only while the engine waits for one), 2 passes planned by their tokens found "
            "too long"
        ) in title, title
        # tokens: never "100.0 % full · tail waste 0" without the engine's token counts
        assert "not known on a mirror" in got["note"] and "% full" not in got["note"], got
        assert "never how many tokens" in got["noteTitle"] or got["noteTitle"].startswith(
            "not known on a mirror: "
        ), got
        held = {x["text"].split(" ")[0]: x for x in got["legend"]}
        for name in ("held", "tail"):
            assert held[name]["text"].endswith("not known") and held[name]["unknown"], got
        # regret owners: the mirror's pool is told no requests
        rows = wait_for(
            lambda: p.js(
                """() => { const r = [...document.querySelectorAll('#regret-body tr[data-root]')];
                  const rows = r.map((e) => ({text: e.lastChild.textContent,
                    why: [...e.lastChild.querySelectorAll('[data-unknown]')].map((u) => u.title)}));
                  // (rows drawn before the page knew it mirrors are drawn again at the next poll)
                  return r.length && rows.every((x) => x.why.length === 2 &&
                    x.why.every((w) => w.startsWith('not known on a mirror: '))) && rows; }"""
            ),
            what="the regret table's owners said not known on a mirror",
        )
        for r in rows:
            assert "—" not in r["text"] and r["text"] == "not known → not known", r
            assert len(r["why"]) == 2 and all(
                w.startswith("not known on a mirror: ") for w in r["why"]
            )
        p.shot()
        assert p.errors == [], p.errors
    finally:
        p.close()


# -------------------------------------------------------------- item 9


STALE_JS = """() => {
  const banner = document.getElementById('engine-banner');
  const filter = (sel) => getComputedStyle(document.querySelector(sel)).filter;
  const visible = (e) => e.getClientRects().length && getComputedStyle(e).visibility !== 'hidden';
  const live = [...document.querySelectorAll('body *')].filter((e) => !e.children.length &&
      visible(e) && e.tagName !== 'BUTTON' && e.tagName !== 'OPTION' &&
      /^live$/i.test(e.textContent.trim())).map((e) => e.id || e.className);
  return {engine: document.body.dataset.engine, banner: banner.hidden ? null : banner.textContent,
    bannerShown: visible(banner), stats: filter('#stats'), charts: filter('.charts'),
    side: filter('.side'), mode: document.getElementById('tl-mode').textContent,
    stream: document.getElementById('h-state').textContent,
    live};
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_a_silent_engine_makes_the_whole_page_stale(browser: Any, width: int) -> None:
    with mirrored() as m:
        m.drive(30)
        p = _page(browser, m, f"mirror-truth-stale-{width}", width)
        try:
            wait_for(
                lambda: "exact" in p.js("() => document.getElementById('h-mirror').textContent"),
                what="exact",
            )
            live = p.js(STALE_JS)
            assert live["engine"] == "live" and live["banner"] is None, live
            assert live["stats"] == "none" and live["mode"] == "live", live
            m.silence()  # the engine's plugin says nothing more
            got = wait_for(
                lambda: (g := p.js(STALE_JS))["engine"] == "stale" and g["stream"] != "live" and g,
                what="the page stale",
            )
            assert got["bannerShown"] and got["banner"].startswith("STALE"), got
            assert "said nothing for" in got["banner"] and "not live" in got["banner"], got
            for part in ("stats", "charts", "side"):
                assert got[part] != "none", got  # dimmed
            assert got["mode"] == "stale" and got["stream"] == "stale (engine)", got
            assert got["live"] == [], got  # no "live" left anywhere on the page
            p.shot()
            assert p.errors == [], p.errors
        finally:
            p.close()


# -------------------------------------------------------------- the walk


WALK_JS = """() => {
  const visible = (e) => e.getClientRects().length > 0;
  const tiles = Object.fromEntries([...document.querySelectorAll('#stats .stat')].map((t) =>
    [t.dataset.stat, {text: t.querySelector('.value').textContent,
      value: t.querySelector('.value').dataset.value, reason: t.dataset.reason || ''}]));
  // a bare dash in a tile, a legend, the token note, the regret owners: a default with no reason
  const dashes = [...document.querySelectorAll(
      '#stats .value, .mc-legend b, #tokens-note, #regret-body td, [data-h] b, #rv-times td')]
    .filter((e) => visible(e) && e.textContent.trim() === '—' &&
      !e.closest('[data-reason], [data-unknown], [title]'))
    .map((e) => (e.closest('[id]') || e).id);
  // a chart saying "none yet" / "no samples yet": which
  const empty = [...document.querySelectorAll('.mc-empty')].filter((e) => !e.hidden && visible(e))
    .map((e) => [(e.closest('[id]') || e).id, e.textContent]);
  return {tiles, dashes, empty};
}"""


def _engine_figures(m: Mirrored) -> dict[str, Any]:
    """The engine's own pool and counters (its figures, not the mirror's)."""
    rt = m.engine.rt
    pool = rt.pool
    blocks = pool.blocks[1:]  # block 0: the null block
    in_use = sum(1 for b in blocks if b.ref_cnt > 0)
    cached = sum(1 for b in blocks if b.ref_cnt == 0 and b.block_hash is not None)
    st = rt.manager.stats
    return {
        "in_use": in_use,
        "cached": cached,
        "empty": len(blocks) - in_use - cached,
        "usage": in_use / len(blocks),
        "hit": st.hits / st.queries,
        "keys": len(pool.cached_block_hash_to_block),
        # requests told as scheduled and not finished: the engine's running queue
        "running": len(rt.manager.requests),
    }


@pytest.mark.parametrize("width", WIDTHS)
def test_walk_every_tile_panel_and_chart(browser: Any, mirror: Mirrored, width: int) -> None:
    """No default standing for an unknown: each tile the engine's figure or
    "not known" with the reason; no bare "—"; no chart empty while its data exists."""
    p = _page(browser, mirror, f"mirror-truth-walk-{width}", width)
    try:
        want = _engine_figures(mirror)
        assert want["running"] > 0 and want["hit"] > 0
        got = wait_for(
            lambda: (
                (g := p.js(WALK_JS))["tiles"]["in_use"]["value"] == str(want["in_use"])
                and not any(e[0] in ("chart-miss-ago", "chart-miss-pos") for e in g["empty"])
                and g
            ),
            what="the tiles at the engine's pool, the charts drawn",
        )
        tiles = got["tiles"]
        # the pool: the engine's
        for key in ("in_use", "cached", "empty"):
            assert tiles[key]["value"] == str(want[key]), (key, tiles[key], want)
        assert abs(float(tiles["usage"]["value"]) - want["usage"]) < 1e-9, (tiles["usage"], want)
        assert tiles["usage01"]["text"] == f"{want['usage']:.3f}", tiles["usage01"]
        assert tiles["keys"]["value"] == str(want["keys"]), (tiles["keys"], want)
        assert tiles["hit"]["text"] == f"{want['hit'] * 100:.1f}%", (tiles["hit"], want)
        # every tile a figure, or "not known" with its reason: never a bare dash
        for key, t in tiles.items():
            assert t["text"] not in ("", "—") or t["reason"], (key, t)
            if t["text"] == "not known":
                assert t["reason"], (key, t)
        assert got["dashes"] == [], got["dashes"]
        # the charts with data are drawn: the evicted misses (REST has them), the regret gap
        rest = _rest(mirror, "/api/misses")["evicted_misses"]
        empty = dict(got["empty"])
        if rest["ago_seconds"]["count"]:
            assert "chart-miss-ago" not in empty and "chart-miss-pos" not in empty, empty
        if _rest(mirror, "/api/regret")["gap_seconds"]["count"]:
            assert "chart-regret-gap" not in empty, empty
        # RUNNING and WAITING are the engine's: the requests it scheduled and has
        # not finished, and none waiting (each is scheduled as it arrives).
        # NOTE: fails until branch `metrics` (the engine's queues on a mirror)
        # is merged -- before it, the server sends 0 as a default and the page
        # says "not known" (with the reason) instead.
        assert (tiles["requests"]["value"], tiles["waiting"]["value"]) == (
            str(want["running"]),
            "0",
        ), (tiles["requests"], tiles["waiting"], want, walk_values(p))
        p.shot()
        assert p.errors == [], p.errors
    finally:
        p.close()
