"""The fleet page keeps each instance's ``--dashboard`` link once the stream
speaks: the websocket's instance list carries ``dashboard_url`` as
``/api/fleet`` does (it used to drop it, and the first message took the
links away).  Headless Chromium at 1600, 1280 and 1000 px against a real
``blockpool observe``; never skipped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq

from tests.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.kvevents.helpers import Workload, positional, truth
from tests.support.cli import start_cli_observer, stop_cli_server
from tests.support.ports import free_port
from tests.support.wait import CLIENT_TIMEOUT, eventually

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "kvevents"
LINK = "http://127.0.0.1:8101/"

# counts the stream's messages that list the instances (the page redraws
# its cards from each)
COUNT_STREAM = """
(() => {
  window.__instanceLists = 0;
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (ev) => {
        if (typeof ev.data === "string" && ev.data.includes('"instances"')) {
          window.__instanceLists += 1;
        }
      });
    }
  };
})();
"""


BIND = f"tcp://127.0.0.1:{free_port()}"  # where b's publishers connect (--bind)


@pytest.fixture(scope="module")
def observer() -> Iterator[str]:
    port = free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    args = [
        f"a=tcp://127.0.0.1:{free_port()}",
        "--bind", f"b={BIND}",
        "--dashboard", f"a={LINK}", "--log-level", "warning",
    ]  # fmt: skip
    proc = start_cli_observer(port, ARTIFACTS / "observer-links.log", *args)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_cli_server(proc)


def subscribed_pub(ctx: zmq.Context[Any]) -> zmq.Socket[Any]:
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(BIND)
    assert pub.poll(60_000) and pub.recv()[:1] == b"\x01", "no subscription"
    return pub


@pytest.mark.browser
@pytest.mark.parametrize("width", [1600, 1280, 1000])
def test_the_dashboard_link_stays_on_its_card_once_the_stream_speaks(
    observer: str, width: int
) -> None:
    fleet = httpx.get(observer + "/api/fleet", timeout=CLIENT_TIMEOUT).json()
    assert {i["name"]: i["dashboard_url"] for i in fleet["instances"]} == {"a": LINK, "b": None}
    require_chromium()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))

            def console(m: Any) -> None:
                if m.type == "error":
                    errors.append(f"console: {m.text}")

            page.on("console", console)
            page.add_init_script(COUNT_STREAM)
            page.goto(observer + "/")
            page.wait_for_selector('#stream-state[data-state="open"]', timeout=60_000)
            # the hello and a tick after it: the cards now come from the stream
            page.wait_for_function("() => window.__instanceLists >= 2", timeout=60_000)
            link = '#instances .instance[data-name="a"] a.dashboard-link'
            page.wait_for_selector(link, state="visible", timeout=10_000)
            assert page.get_attribute(link, "href") == LINK
            assert page.get_attribute(link, "target") == "_blank"
            assert "noopener" in (page.get_attribute(link, "rel") or "")
            assert page.query_selector_all('#instances .instance[data-name="b"] a') == []
            # on its card, inside the page, not covered by anything
            box = page.eval_on_selector(
                link,
                """el => {
                  const r = el.getBoundingClientRect();
                  const card = el.closest('.instance').getBoundingClientRect();
                  const top = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
                  return {left: r.left, right: r.right, width: r.width, height: r.height,
                          cardLeft: card.left, cardRight: card.right,
                          onTop: top === el || el.contains(top),
                          pageWidth: document.documentElement.clientWidth};
                }""",
            )
            assert box["width"] > 0 and box["height"] > 0, box
            assert box["cardLeft"] <= box["left"] and box["right"] <= box["cardRight"], box
            assert box["right"] <= box["pageWidth"] and box["onTop"], box
            page.screenshot(path=str(ARTIFACTS / f"fleet-links-{width}.png"))
        finally:
            browser.close()
    assert errors == []


@pytest.mark.browser
def test_a_refused_second_publisher_shows_on_its_card(observer: str) -> None:
    w = Workload(seed=501)
    first, forged = w.batches(2)
    ctx = zmq.Context()
    try:
        pub, stranger = subscribed_pub(ctx), subscribed_pub(ctx)
        pub.send_multipart([b"", (0).to_bytes(8, "big"), positional(first)])

        def card() -> dict[str, Any]:
            fleet = httpx.get(observer + "/api/fleet", timeout=CLIENT_TIMEOUT).json()
            one: dict[str, Any] = next(i for i in fleet["instances"] if i["name"] == "b")
            return one

        eventually(lambda: card()["last_seq"] == 0, 60, "the publisher's batch")
        stranger.send_multipart([b"", (0).to_bytes(8, "big"), positional(forged)])
        eventually(lambda: card()["refused_messages"] == 1, 60, "the refusal")
        assert card()["keys"] == len(truth([first])) > 0  # the forged batch not applied
        require_chromium()
        from playwright.sync_api import sync_playwright

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(observer + "/")
                line = '#instances .instance[data-name="b"] .reason.refused'
                page.wait_for_selector(line, state="visible", timeout=60_000)
                text = page.inner_text(line)
                assert "1 message(s) from 1 other publisher connection(s) refused" in text
            finally:
                browser.close()
    finally:
        ctx.destroy(linger=0)
    w.check()
