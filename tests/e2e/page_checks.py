"""What the dashboard shows, read from the page, and its agreement with
the server's REST summary; the time-travel slider moved to a moment."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import ARTIFACTS, Page, Server, wait_for

PAGE_STATS_JS = """() => {
  const v = (k) => Number(document.getElementById('stat-' + k).dataset.value);
  return {in_use: v('in_use'), cached: v('cached'), empty: v('empty'),
          keys: v('keys'), requests: v('requests')};
}"""

MODEL_JS = """() => {
  const m = window.__bp.model;
  return {seq: m.seq, epoch: m.epoch, n: m.n, counts: m.countStates(),
          header: m.header.blocks, keys: m.header.hash_map_keys};
}"""


def rest_stats(server: Server) -> dict[str, int]:
    s = server.get("/api/summary")
    b = s["blocks"]
    return {
        "in_use": b["in_use"],
        "cached": b["cached"],
        "empty": b["empty"],
        "keys": s["hash_map_keys"],
        "requests": s["running_requests"],
    }


def wait_page_agrees(page: Page, server: Server, timeout: float = 60.0) -> dict[str, int]:
    """The numbers the page shows equal GET /api/summary (pool quiet)."""

    def agree() -> Any:
        want = rest_stats(server)
        got = page.js(PAGE_STATS_JS)
        return want if got == want else None

    return wait_for(agree, timeout, "the page's numbers to match /api/summary")


def region_shot(p: Page, selector: str, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p.page.locator(selector).screenshot(path=str(ARTIFACTS / f"{p.name}-{name}.png"))


SCRUB_JS = """(seq) => { const el = document.getElementById('tl-slider');
  el.value = String(seq); el.dispatchEvent(new Event('input')); }"""


def scrub(p: Page, seq: int) -> None:
    """The time-travel slider moved to op ``seq``, as a drag does; returns
    once the page shows that recorded moment."""
    p.js(SCRUB_JS, seq)
    p.page.wait_for_function(
        "(seq) => document.getElementById('history-banner').dataset.seq === String(seq)"
        " && document.body.dataset.mode === 'history'",
        arg=seq,
    )
