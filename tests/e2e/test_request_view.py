"""The request view in headless Chromium: search a request id, see the
blocks, hits and misses with reasons the story endpoint gives; open it
from the running list with one click."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import ARTIFACTS, Page, Server, wait_for

pytestmark = pytest.mark.browser

VIEW_JS = """() => {
  const el = document.getElementById('request-view');
  const rid = document.getElementById('rv-rid');
  return {state: el.dataset.state || '', rid: rid ? rid.textContent : null,
          blocks: Array.from(document.querySelectorAll('#rv-blocks tbody tr')).map((tr) => ({
            index: Number(tr.dataset.index), reason: tr.dataset.reason,
            ids: Array.from(tr.querySelectorAll('a[data-block]')).map(
              (a) => Number(a.dataset.block))})),
          bars: document.querySelectorAll('#rv-bars .rq-bar').length,
          times: Array.from(document.querySelectorAll('#rv-times tr')).map((tr) => tr.dataset.time),
          ops: Array.from(document.querySelectorAll('#rv-timeline tr[data-op]')).map(
            (tr) => tr.dataset.op)};
}"""


def finished_demo_request(server: Server) -> str:
    """A demo request that finished and whose story the server still tells."""
    recent = server.get("/api/misses?limit=50")["recent_requests"]
    done = [r["request_id"] for r in recent if r["finished"]]
    return done[0] if done else ""


def expected_blocks(story: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "index": b["index"],
            "reason": b["reason"] or ("hit" if b["hit"] else b["kind"]),
            "ids": b["block_ids"] or [],
        }
        for b in story["blocks"]
    ]


def test_search_shows_the_story_of_a_finished_request(dashboard: Page, server: Server) -> None:
    p = dashboard
    rid = wait_for(lambda: finished_demo_request(server), timeout=60, what="a finished request")
    story = server.get(f"/api/requests/{rid}/story")
    assert story["state"] == "finished" and story["blocks"]
    p.page.fill("#rv-id", rid)
    p.page.click("#rv-form button[type=submit]")
    view = wait_for(
        lambda: (v := p.js(VIEW_JS))["rid"] == rid and v["state"] == "finished" and v,
        what="the story on the page",
    )
    # a finished request's story does not change: the page shows what REST says
    assert view["blocks"] == expected_blocks(story)
    assert view["bars"] == len(story["blocks"])
    assert view["times"] == ["first tried", "admitted", "first decode", "last decode", "finished"]
    assert view["ops"] == [x["op"] for x in story["timeline"]]
    assert view["ops"][-1] == "finish"
    hits = sum(1 for b in story["blocks"] if b["hit"])
    assert p.page.text_content("#rv-hits").startswith(f"hit {hits} blocks")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p.page.locator("#request-view").screenshot(path=str(ARTIFACTS / "request-view.png"))
    # an unknown id: the server's reason, in the panel
    p.page.fill("#rv-id", "no-such-request")
    p.page.click("#rv-form button[type=submit]")
    wait_for(lambda: p.js("() => document.getElementById('request-view').dataset.state") == "error")
    assert "nothing is known of request 'no-such-request'" in p.page.text_content("#rv-error")
    assert p.errors == []


def test_the_running_list_links_to_the_story(dashboard: Page, server: Server) -> None:  # noqa: ARG001 fixture starts the server
    p = dashboard
    link = "#req-body [data-story]"
    wait_for(lambda: p.js(f"() => document.querySelectorAll('{link}').length") > 0,
             timeout=30, what="running requests listed")  # fmt: skip
    # the list is re-rendered every 2 s under the demo: pick and click in one step
    rid = p.js(
        f"() => {{ const b = document.querySelector('{link}'); b.click(); return b.dataset.story }}"
    )
    view = wait_for(
        lambda: (v := p.js(VIEW_JS))["rid"] == rid and v["state"] in ("running", "finished") and v,
        what="the story of the clicked request",
    )
    assert view["blocks"], view
    assert view["ops"][0] == "admit" or view["ops"][0] == "append", view
    # its prompt blocks carry a hit or a reason (the analysis may be a tick behind: "prompt")
    reasons = {b["reason"] for b in view["blocks"]}
    allowed = {"hit", "decode", "prompt", "last_token", "block_size_floor", "cold", "evicted",
               "extra_keys", "chain_broken", "reset", "skipped"}  # fmt: skip
    assert reasons <= allowed, reasons
    assert p.errors == []
