"""The dashboard on a mirror: the top bar's mirror item says the pool is the
engine's, exactly; on any other service the item is not there."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.main import create_app
from app.mirror import setup as mirror_setup
from tests.app.conftest import LiveServer, free_port, make_app, make_settings
from tests.e2e.conftest import Page, wait_for
from tests.mirror.fake_engine import FakeEngine
from tests.mirror.workload import FollowedEngine

pytestmark = pytest.mark.browser


def test_the_mirror_item_shows_an_exact_mirror(browser: Any) -> None:
    engine = FollowedEngine(num_blocks=256, free_order="uncached_first")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # the engine side of the wire contract (DEALER/ROUTER snapshots), as in tests/mirror
    sender = FakeEngine(engine, endpoint, f"tcp://127.0.0.1:{free_port()}")
    engine.send = sender.offer
    sender.start()
    server = None
    try:
        hello = mirror_setup.wait_hello(endpoint, 30.0)
        app = create_app(mirror_setup.settings_for(hello, make_settings()))
        client = mirror_setup.install(app, endpoint, mirror_setup.control_for(endpoint, hello))
        server = LiveServer(app, free_port())
        server.start()
        p = Page(browser, server.url, "mirror")
        # an idle mirror: the engine has done nothing yet, the analysis waits for it
        wait_for(
            lambda: (
                p.js("() => document.getElementById('h-analysis').textContent")
                == "on, waiting for operations"
            ),
            what="the analysis item waits for operations",
        )
        # read only: no "writes: open", the controls that would change the pool are gone
        wait_for(
            lambda: (
                p.js("() => document.getElementById('auth-note').textContent") == "read-only mirror"
            ),
            what="the top bar says read-only mirror",
        )
        shown = p.js(
            """() => ["demo-start", "trace-start", "admit-form", "reset-btn"].map(
                (id) => document.getElementById(id).closest(".ctl-group").offsetParent !== null)"""
        )
        assert shown == [False, False, False, False]
        assert p.js("() => document.getElementById('reset-btn').disabled")
        assert "read-only mirror" in p.js("() => document.getElementById('ctl-result').textContent")
        engine.drive(30)
        text = wait_for(
            lambda: (
                "exact" in (t := p.js("() => document.getElementById('h-mirror').textContent"))
                and t
            ),
            what="the mirror item says exact",
        )
        assert "vLLM 0.32.0" in text
        assert p.js("() => document.body.dataset.mirror") == "1"
        title = p.js("() => document.querySelector('[data-h=mirror]').title")
        assert endpoint in title and "divergences 0" in title
        assert "last matching digest" in title and "operations since" in title  # exact: one matched
        assert client.status.exact

        # the lag from the engine's step to this page, from the frames' mirror header
        # (a sample needs a delta bringing a new batch; a page resynced by a
        # snapshot under load has seen every batch so far, so the engine keeps
        # stepping until one arrives as a delta)
        def lag_shown() -> Any:
            got = p.js(
                """() => { const e = document.getElementById('h-mirror-page');
                  return !e.hidden && Number(e.dataset.samples) >= 1 &&
                    {text: e.textContent, title: e.title, last: Number(e.dataset.lastMs),
                     p50: Number(e.dataset.p50Ms), n: Number(e.dataset.samples)}; }"""
            )
            if not got:
                engine.drive(1)
            return got

        page = wait_for(lag_shown, what="the mirror item shows the lag to the page")
        assert page["text"] == f" · page {math.floor(page['last'] + 0.5)}ms", page  # Math.round
        assert math.isfinite(page["p50"]) and 1 <= page["n"] <= 100, page
        assert "p50" in page["title"] and "one clock" in page["title"], page
        # the stream arrives in the browser too: the auth note stays read only
        assert p.js("() => document.getElementById('auth-note').textContent") == "read-only mirror"
        assert p.errors == [] and p.network == [], (p.errors, p.network)
        server.call(server.engine.check)
    finally:
        if server is not None:
            server.stop()
        sender.close()


def test_no_mirror_item_without_a_mirror(browser: Any) -> None:
    server = LiveServer(make_app(), free_port())
    server.start()
    try:
        p = Page(browser, server.url, "plain")
        wait_for(
            lambda: p.js("() => !document.querySelector('[data-h=mirror]')"),
            what="the item gone",
        )
        assert p.errors == [] and p.network == [], (p.errors, p.network)
        server.call(server.engine.check)
    finally:
        server.stop()
