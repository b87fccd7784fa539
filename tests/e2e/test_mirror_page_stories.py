"""The dashboard true on a mirror, of the engine's requests (issue 29,
items 7 and 8), at 1600, 1280 and 1000 px: the evicted-miss charts against
the requests' stories, and a story looked up by the client's id
(tests/e2e/mirror_page.py: the engine, the mirror and the ids told)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.mirror_page import WIDTHS, Mirrored, open_page, rest_json
from tests.mirror.workload import BLOCK

pytestmark = pytest.mark.browser


def _evicted_in_stories(m: Mirrored) -> list[float]:
    """Every evicted prompt block's age, from the stories (the same source as the charts)."""
    ages: list[float] = []
    for rid in list(m.client.book.requests):
        for b in rest_json(m, f"/api/requests/{rid}/story")["blocks"]:
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
    p = open_page(browser, mirror, f"mirror-truth-misscharts-{width}", width)
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
        rest = rest_json(mirror, "/api/misses")["evicted_misses"]
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
    p = open_page(browser, mirror, f"mirror-truth-clientid-{width}", width)
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
