"""The dashboard true on a mirror where it does not know (issue 29, items 9
and 10), at 1600, 1280 and 1000 px: the unknowns said with their reason and
the lags labelled, and the whole page stale when the engine goes silent
(tests/e2e/mirror_page.py)."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.mirror.protocol import DigestReading
from tests.e2e.conftest import wait_for
from tests.e2e.mirror_page import WIDTHS, Mirrored, mirrored, open_page

pytestmark = pytest.mark.browser


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
    p = open_page(browser, mirror, f"mirror-truth-unknowns-{width}", width)
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
        p = open_page(browser, m, f"mirror-truth-stale-{width}", width)
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
