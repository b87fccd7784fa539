"""Words an operator understands: every stat tile, health item,
legend entry and column head on the dashboard explains itself on hover, and
docs/glossary.md lists every term the page explains (frontend/js/common/terms.js)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.e2e.conftest import REPO, Page, Server, wait_for

TERMS_JS = REPO / "frontend" / "js" / "common" / "terms.js"
GLOSSARY = REPO / "docs" / "glossary.md"


def terms() -> list[str]:
    body = TERMS_JS.read_text().split("export const TERMS = {", 1)[1].split("\n};", 1)[0]
    return re.findall(r'^  "?([^":\n]+)"?: \{ help: "[^"]+"', body, re.M)


def test_the_glossary_lists_every_term() -> None:
    names = terms()
    assert len(names) > 60
    listed = set(re.findall(r"^\| \*\*(.+?)\*\* \|", GLOSSARY.read_text(), re.M))
    assert [t for t in names if t not in listed] == []


UNEXPLAINED_JS = """() => {
  const shown = (e) => e.getClientRects().length > 0;
  const text = (e) => e.textContent.trim();
  const missing = [];
  const need = (sel, what) => {
    const els = [...document.querySelectorAll(sel)].filter((e) => shown(e) && text(e));
    for (const e of els) if (!(e.title || '').trim()) missing.push(`${what}: ${text(e)}`);
    return els.length;
  };
  const counts = {
    tiles: need('#stats .stat', 'tile'),
    health: need('#health .hitem', 'health'),
    legend: need('#legend .lg', 'legend'),
    heads: need('thead th', 'column'),
    detail: need('#detail-body .kv th', 'detail'),
    chartLegends: need('.mc-legend .mc-item', 'chart legend'),
    uplotLegends: need('.u-legend .u-series th', 'chart legend'),
    lru: need('#lru-summary > span', 'queue summary'),
    demoForm: need('#demo-form label', 'demo field'),
    regret: need('#regret-summary > span', 'regret summary'),
    detailTitle: need('#detail-title > span', 'block detail title'),
  };
  // a panel title explains itself, not another term: its data-term is its own words
  const wrong = [];
  for (const e of document.querySelectorAll('h2[data-term]')) {
    const own = [...e.childNodes].filter((n) => n.nodeType === 3)
      .map((n) => n.textContent).join('').trim();
    if (e.dataset.term !== own.toLowerCase()) wrong.push(`${own} shows "${e.dataset.term}"`);
    if (!(e.title || '').trim()) missing.push(`panel title: ${own}`);
  }
  return {counts, missing, wrong, tile: document.querySelector('[data-stat="hit"]').title};
}"""


@pytest.mark.browser
def test_every_tile_and_term_explains_itself(dashboard: Page, server: Server) -> None:
    p = dashboard
    assert server.post("/api/demo/start").status_code == 200
    wait_for(lambda: p.js("() => document.querySelectorAll('#lru-summary > span').length") > 0)
    # pin a block: the detail panel's rows have their explanations too
    wait_for(lambda: p.js("() => window.__bp.model.header.blocks.in_use") > 0)
    bid = p.js("() => window.__bp.model.state.findIndex((s) => s === 1)")
    xy = p.js("(id) => window.__bp.map.cellCenterPage(id)", bid)
    p.page.mouse.click(xy["x"], xy["y"])
    wait_for(lambda: p.js("() => document.querySelectorAll('#detail-body .kv th').length") > 3)
    p.page.locator("#regret-summary").scroll_into_view_if_needed()
    wait_for(lambda: p.js("() => document.querySelectorAll('#regret-summary > span').length") == 3)
    got: dict[str, Any] = p.js(UNEXPLAINED_JS)
    assert got["missing"] == [], got["missing"]
    assert got["wrong"] == [], got["wrong"]
    assert got["counts"]["demoForm"] == 8 and got["counts"]["regret"] == 3, got["counts"]
    # block #0: the null block and its badge say what they are
    p.js("() => window.__bp.detail.select(0)")
    wait_for(lambda: p.js("() => document.getElementById('detail-state')?.textContent") == "null")
    null_got: dict[str, Any] = p.js(UNEXPLAINED_JS)
    assert null_got["missing"] == [], null_got["missing"]
    badge = p.js("() => document.getElementById('detail-state').title")
    assert "never hands out" in badge, badge
    assert got["counts"]["tiles"] == 13 and got["counts"]["health"] >= 9  # 13 tiles (buildStats)
    assert got["counts"]["heads"] >= 10 and got["counts"]["legend"] == 8, got["counts"]
    assert "vllm:prefix_cache_hits" in got["tile"]
    # the queue summary says "pos N" for a position, never "#N" (that is a block id)
    first = p.js("() => document.getElementById('lru-first').textContent")
    assert first == "—" or first.startswith("pos "), first
    # the analysis lag is in operations, and says so
    wait_for(lambda: "ops" in p.js("() => document.getElementById('h-analysis').textContent"))
    assert p.errors == []
