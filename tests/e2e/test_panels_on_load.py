"""The analysis row as a page opens late, in headless Chromium: the panels
ask REST at once and say "loading…" until it answers (held here by the
test), then show the server's data without waiting for the stream; their
charts start with the server's recent history, before the page's load time.
The operator tiles (hit rate 1m / 5m / since start, running, waiting) show
the server's figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import hooks
from tests.e2e.conftest import ARTIFACTS, VIEWPORT, Server, running, wait_for

pytestmark = pytest.mark.browser

HELD = ("**/api/analysis/recent*", "**/api/misses?*", "**/api/regret?*")

LOADING_JS = """() => {
  const p = window.__bp.panels;
  const empty = (c) => c.emptyEl.hidden ? '' : c.emptyEl.textContent;
  return {misses: empty(p.misses.chart), ago: empty(p.misses.ago.chart),
          gap: empty(p.regret.gap.chart), regret: empty(p.regret.chart),
          regretBody: document.getElementById('regret-body').textContent,
          recent: document.getElementById('miss-recent').textContent};
}"""

LOADED_JS = """() => {
  const bp = window.__bp;
  const p = bp.panels;
  const first = (c) => (c.x && c.x.length ? c.x[0] : null);
  return {state: bp.loader.state, seeded: bp.loader.seededCount,
          sections: bp.analysis.series.sections,
          misses: {first: first(p.misses.chart), n: p.misses.chart.x.length},
          regret: {first: first(p.regret.chart), n: p.regret.chart.x.length},
          tokens: {first: first(p.tokens.chart), n: p.tokens.chart.x.length},
          ago: p.misses.ago.chart.x.length, gap: p.regret.gap.chart.x.length,
          agoEmpty: p.misses.ago.chart.emptyEl.hidden ? '' : p.misses.ago.chart.emptyEl.textContent,
          regretRows: Array.from(document.querySelectorAll('#regret-body tr')).map(
            (tr) => tr.dataset.root || tr.textContent),
          recentRows: document.querySelectorAll('#miss-recent tr[data-rid]').length,
          loadTs: performance.timeOrigin / 1000};
}"""

TILES_JS = """() => Object.fromEntries(['hit1m', 'hit5m', 'hit', 'requests', 'waiting', 'usage',
                                         'usage01'].map(
  (k) => { const el = document.getElementById('stat-' + k);
           return [k, {label: el.parentElement.querySelector('.label').textContent,
                       text: el.textContent, value: el.dataset.value}]; }))"""


@pytest.fixture(scope="module")
def busy() -> Iterator[Server]:
    """A small pool under the demo: it evicts, misses evicted prefixes and regrets soon."""
    with running(
        "panels-on-load", "--num-blocks", "768", "--demo", "--log-level", "warning"
    ) as srv:
        yield srv


def ran_a_while(srv: Server) -> bool:
    m = srv.get("/api/misses?limit=5")
    r = srv.get("/api/regret?limit=5")
    recent = srv.get("/api/analysis/recent?seconds=900")
    return bool(
        m["evicted_misses"]["ago_seconds"]["count"] > 0
        and r["regrets_total"] > 0
        and r["top_prefixes"]
        and len(recent["sections"]) >= 8
    )


def test_panels_fill_from_rest_on_open_with_the_recent_history(browser: Any, busy: Server) -> None:
    wait_for(lambda: ran_a_while(busy), timeout=120, what="evicted misses, regrets, 8 s of history")
    ctx = browser.new_context(viewport=VIEWPORT)
    hooks.install(ctx)  # window.__bp
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    held: list[Any] = []
    holding = [True]

    def hold(route: Any) -> None:
        if holding[0]:
            held.append(route)
        else:
            route.continue_()

    for pattern in HELD:
        page.route(pattern, hold)
    try:
        page.goto(busy.url + "/")
        page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=40_000)
        # the REST answers are held: every panel says it is loading
        wait_for(lambda: (page.evaluate("() => 1"), len(held) >= 3)[1], what="the held REST calls")
        paths = sorted({r.request.url.split("/api/")[1].split("?")[0] for r in held})
        assert paths == ["analysis/recent", "misses", "regret"], paths
        # the stream draws its first points meanwhile: the charts still say so
        page.wait_for_function(
            "() => window.__bp.analysis.series.sections >= 3"
            " && window.__bp.panels.misses.chart.x.length > 0",
            timeout=40_000,
        )
        loading = page.evaluate(LOADING_JS)
        assert loading == {
            "misses": "loading…", "ago": "loading…", "gap": "loading…", "regret": "loading…",
            "regretBody": "loading…", "recent": "loading…",
        }, loading  # fmt: skip
        page.screenshot(path=str(ARTIFACTS / "panels-on-load-loading.png"), full_page=True)
        holding[0] = False
        for route in held:
            route.continue_()
        done = wait_for(
            lambda: (
                (d := page.evaluate(LOADED_JS))["state"].get("misses") == "ok"
                and d["state"].get("regret") == "ok"
                and d["state"].get("recent") == "ok"
                and d
            ),
            timeout=30,
            what="the loader's REST answers",
        )
        # filled from REST, not from stream ticks: the charts hold more points
        # than the stream has brought sections since the page opened
        assert done["seeded"] >= 7, done
        assert done["misses"]["n"] > done["sections"] - done["seeded"] + 1, done
        for chart in ("misses", "regret", "tokens"):
            assert done[chart]["first"] is not None and done[chart]["first"] < done["loadTs"], (
                chart,
                done,
            )
        assert done["ago"] > 0 and done["agoEmpty"] == "", done  # not "none yet"
        assert done["gap"] > 0, done
        assert done["regretRows"] and all(len(r) == 16 for r in done["regretRows"]), done
        assert done["recentRows"] > 0, done
        page.screenshot(path=str(ARTIFACTS / "panels-on-load-loaded.png"), full_page=True)
        assert errors == []
    finally:
        ctx.close()


def test_operator_tiles_show_the_servers_figures(browser: Any, busy: Server) -> None:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    hooks.install(ctx)
    page = ctx.new_page()
    try:
        page.goto(busy.url + "/")
        page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=40_000)
        tiles = wait_for(
            lambda: (t := page.evaluate(TILES_JS))["hit1m"]["text"] != "—" and t,
            what="the hit-rate tiles",
        )
        labels = {k: v["label"] for k, v in tiles.items()}
        assert labels == {
            "hit1m": "hit rate 1m", "hit5m": "hit rate 5m", "hit": "since start",
            "requests": "running", "waiting": "waiting", "usage": "usage",
            "usage01": "usage 0\u20131",
        }  # fmt: skip
        rates = busy.get("/api/pool/rates")
        assert rates["windows"][0]["label"] == "hit rate 1m"
        for key in ("hit1m", "hit5m", "hit"):
            v = float(tiles[key]["value"])
            assert 0.0 <= v <= 1.0 and tiles[key]["text"].endswith("%"), tiles[key]
        # usage: the percentage and vLLM's 0-1 fraction of the same figure
        frac = float(tiles["usage01"]["text"])
        assert frac == pytest.approx(float(tiles["usage01"]["value"]), abs=5e-4)
        assert 0.0 <= frac <= 1.0 and tiles["usage01"]["value"] == tiles["usage"]["value"]
        assert float(tiles["usage"]["text"].rstrip("%")) == pytest.approx(100 * frac, abs=0.1)
        assert int(tiles["waiting"]["value"]) >= 0 and int(tiles["requests"]["value"]) >= 0
        page.screenshot(path=str(ARTIFACTS / "operator-tiles-1280.png"))
    finally:
        ctx.close()
