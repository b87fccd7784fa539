"""Flows that do not trap: the reset dialog says beforehand why a
reset would be refused and offers to stop the workload first, with its
outcome in the dialog; the "fleet" link only to a fleet observer that
answers (``--fleet-url``), opening its page -- never a dead end;
Export says how big the file is (the server's own count of it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import ARTIFACTS, Page, Server, free_port, wait_for
from tests.e2e.workload import quiesce_idle, start_demo
from tests.support.cli import start_cli_observer

pytestmark = pytest.mark.browser

IN_VIEW_JS = """(sel) => {
  const r = document.querySelector(sel).getBoundingClientRect();
  return r.width > 0 && r.top >= 0 && r.left >= 0
    && r.bottom <= innerHeight && r.right <= innerWidth;
}"""


def test_reset_offers_to_stop_the_workload_and_shows_the_outcome(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    assert server.post("/api/demo/start").status_code == 200
    wait_for(lambda: p.js("() => window.__bp.model.header.blocks.in_use") > 0, what="held blocks")
    p.page.click("#reset-btn")
    facts = p.page.inner_text("#reset-facts")
    assert "refuses" in facts and "running request" in facts
    assert p.page.is_visible("#reset-stop")
    assert "refused" in p.page.inner_text("#reset-confirm")
    p.page.click("#reset-stop")
    p.page.wait_for_selector("#reset-outcome.ok", timeout=30_000)
    # the outcome is in the dialog, on screen, and true
    assert p.js(IN_VIEW_JS, "#reset-outcome")
    assert "Reset done" in p.page.inner_text("#reset-outcome")
    s = server.get("/api/summary")
    assert s["running_requests"] == 0 and s["hash_map_keys"] == 0 and s["blocks"]["cached"] == 0
    assert server.get("/api/demo")["running"] is False
    assert p.page.inner_text("#reset-close") == "Close"
    p.shot("-dialog")
    p.page.click("#reset-close")
    assert not p.page.is_visible("#reset-dialog")
    assert p.errors == []


def test_export_says_how_big_the_file_is(dashboard: Page, server: Server) -> None:
    p = dashboard
    start_demo(server)
    wait_for(lambda: server.get("/api/history")["last_seq"] > 500, what="a recording")
    quiesce_idle(server)
    p.page.locator("#tt-panel").scroll_into_view_if_needed()
    p.page.hover("#tt-export")
    wait_for(
        lambda: (
            p.js("() => Number(document.getElementById('tt-export').dataset.bytes || 0)")
            >= server.get("/api/history/export/size")["bytes"] - 100
        ),
        what="the page to measure the recording as it is now",
    )
    shown = int(p.js("() => document.getElementById('tt-export').dataset.bytes"))
    body = httpx.get(server.url + "/api/history/export", timeout=60).content
    # the file is about what the page announced (the size is estimated from
    # the recording's counters, never by writing the file)
    assert abs(len(body) - shown) <= 0.15 * len(body), (len(body), shown)
    label = p.page.inner_text("#tt-export")
    mb = shown / 1048576
    assert label.startswith("Export · ") and ("MB" in label or "KB" in label), label
    if "MB" in label:
        assert abs(float(label.split("· ")[1].split()[0]) - mb) <= 0.1 * mb + 0.1, (label, mb)
    # the memory held is said to be memory, not the file
    wait_for(lambda: "in memory" in p.page.inner_text("#tt-span"), what="the memory held")
    assert p.errors == []


def test_fleet_link_hidden_without_kv_events(dashboard: Page) -> None:
    assert dashboard.js("() => document.getElementById('fleet-link').hidden") is True


@pytest.fixture(scope="module")
def publishing() -> Iterator[tuple[Server, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    srv = Server(
        free_port(), "--num-blocks", "1024", "--log-level", "warning",
        "--kv-events-endpoint", endpoint, "--kv-events-bind", "bind", name="publishing",
    )  # fmt: skip
    srv.start()
    yield srv, endpoint
    srv.close()


def link_state(p: Page) -> dict[str, Any]:
    p.page.wait_for_function("() => document.getElementById('fleet-link').dataset.checked")
    state: dict[str, Any] = p.js(
        "() => { const a = document.getElementById('fleet-link');"
        " return {hidden: a.hidden, href: a.getAttribute('href'), title: a.title}; }"
    )
    return state


def test_fleet_link_opens_a_real_observer_or_is_not_shown(
    browser: Any, publishing: tuple[Server, str]
) -> None:
    srv, endpoint = publishing
    # publishing, but no observer named: no link (the pool server has no fleet page)
    p = Page(browser, srv.url, "flows-fleet-link-none")
    try:
        assert link_state(p)["hidden"] is True
    finally:
        p.close()
    port = free_port()
    fleet = f"http://127.0.0.1:{port}/"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "flows-observer.log"
    observer = start_cli_observer(port, log, f"pool={endpoint}", "--log-level", "warning")
    linked = Server(
        free_port(), "--num-blocks", "256", "--log-level", "warning", "--fleet-url", fleet,
        name="linked",
    )  # fmt: skip
    try:
        linked.start()
        assert linked.get("/api/kv-events")["fleet_url"] == fleet
        p = Page(browser, linked.url, "flows-fleet-link")
        try:
            state = link_state(p)
            assert state["hidden"] is False and state["href"] == fleet, state
            assert fleet in state["title"]
            with p.ctx.expect_page() as opened:
                p.page.click("#fleet-link")
            page = opened.value
            page.wait_for_selector('#instances .instance[data-name="pool"]', timeout=30_000)
            assert page.url.startswith(fleet)
        finally:
            p.close()
        # the observer gone: the link is not shown
        observer.terminate()
        observer.wait(30)
        p = Page(browser, linked.url, "flows-fleet-link-gone")
        try:
            assert link_state(p)["hidden"] is True
        finally:
            p.close()
    finally:
        if observer.poll() is None:
            observer.kill()
            observer.wait()
        linked.close()
