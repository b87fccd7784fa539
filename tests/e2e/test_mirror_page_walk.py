"""A walk over every tile, panel and chart of the dashboard on a mirror
(issue 29, the page walk), at 1600, 1280 and 1000 px: each figure the
engine's own, and a default standing for an unknown fails it
(tests/e2e/mirror_page.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import wait_for
from tests.e2e.mirror_page import WIDTHS, Mirrored, open_page, rest_json, walk_values

pytestmark = pytest.mark.browser


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
    p = open_page(browser, mirror, f"mirror-truth-walk-{width}", width)
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
        rest = rest_json(mirror, "/api/misses")["evicted_misses"]
        empty = dict(got["empty"])
        if rest["ago_seconds"]["count"]:
            assert "chart-miss-ago" not in empty and "chart-miss-pos" not in empty, empty
        if rest_json(mirror, "/api/regret")["gap_seconds"]["count"]:
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
