"""A trace replay on the live dashboard: its progress and the trace's own hit
rate in the top bar, as GET /api/trace reports them; hidden without a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Page, Server, free_port, wait_for

pytestmark = pytest.mark.browser

TRACE = Path(__file__).resolve().parents[1] / "trace" / "data" / "mooncake_head50.jsonl"


def test_the_top_bar_shows_the_trace_replay(browser: Any) -> None:
    srv = Server(
        free_port(), "--num-blocks", "100000", "--no-storage", "--trace", str(TRACE),
        "--trace-speed", "20",
        "--log-level", "warning", name="trace-server",
    )  # fmt: skip
    srv.start()
    page = Page(browser, srv.url, "trace-item")
    try:
        p = page
        # the whole trace (50 requests) arrives and finishes: its figures stop moving
        status = wait_for(
            lambda: (
                (s := srv.get("/api/trace"))["stats"]["finished"] + s["stats"]["refused"]
                >= s["requests"]
                and not s["requests_running"]
                and s
            ),
            timeout=180,
            what="the trace to run to its end",
        )
        want = status["stats"]["hit_rate"]
        assert status["loaded"] and status["name"] == TRACE.name and want > 0
        item = (
            "() => { const el = document.querySelector('[data-h=\"trace\"]');"
            " return el && !el.hidden && el.dataset.value !== undefined ?"
            " {text: el.textContent, title: el.title, value: Number(el.dataset.value)} : null; }"
        )
        shown = wait_for(
            lambda: (got := p.js(item)) and abs(got["value"] - want) < 1e-12 and got,
            what="the top bar to show the trace's final hit rate",
        )
        assert TRACE.name in shown["text"] and "hit" in shown["text"], shown
        assert f"of {status['requests']} requests arrived" in shown["title"], shown
        assert "production trace" in shown["title"]
        # the what-if panel: the trace's LRU against the offline optimum at this pool's size
        bound = wait_for(lambda: srv.get("/api/trace")["bound"], what="the trace's bound")
        assert bound["lru_hit_rate"] <= bound["optimal_hit_rate"] <= bound["unbounded_hit_rate"]
        p.page.locator("#whatif-panel").scroll_into_view_if_needed()
        line = wait_for(
            lambda: p.js(
                "() => { const li = document.querySelector('#whatif-text li[data-kind=\"bound\"]');"
                " return li && li.textContent; }"
            ),
            timeout=60,
            what="the what-if panel's line on the optimum",
        )
        for key in ("lru_hit_rate", "optimal_hit_rate", "unbounded_hit_rate"):
            assert f"{bound[key] * 100:.1f}%" in line, (key, line)
        assert "100,000 blocks" in line and TRACE.name in line, line
        p.shot()
        assert p.errors == [], p.errors
    finally:
        page.close()
        srv.close()


def test_no_trace_no_item(dashboard: Page) -> None:
    p = dashboard
    wait_for(lambda: p.js("() => !!document.querySelector('[data-h=\"trace\"]')"), what="the item")
    el = "document.querySelector('[data-h=\"trace\"]')"
    assert p.js(f"() => {el}.hidden") is True
    assert p.js(f"() => {el}.getClientRects().length") == 0  # not drawn at all
    assert p.errors == [], p.errors
