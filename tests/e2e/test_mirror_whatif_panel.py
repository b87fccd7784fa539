"""The what-if panel on a mirror: its shadows are fed from the engine's
requests, in the engine's free order; the panel says so, takes that order
at 1x as its baseline and shows what GET /api/shadows says."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.main import create_app
from app.mirror import setup as mirror_setup
from tests.app.conftest import LiveServer, free_port, make_settings
from tests.e2e.conftest import Page, wait_for
from tests.mirror.fake_engine import FakeEngine
from tests.mirror.test_mirror_whatif import NUM_BLOCKS, serial_traffic
from tests.mirror.workload import FollowedEngine

pytestmark = pytest.mark.browser

ROWS_JS = """() => Array.from(document.querySelectorAll('#whatif-body tr'), tr => ({
    policy: tr.dataset.policy, factor: Number(tr.dataset.factor),
    capacity: Number(tr.dataset.capacity), hit: tr.cells[3].textContent,
    delta: tr.cells[4].textContent}))"""
LINES_JS = """() => Array.from(document.querySelectorAll('#whatif-text li'),
    li => [li.dataset.kind, li.dataset.policy, Number(li.dataset.factor), li.textContent])"""


@pytest.mark.parametrize("width", [1600, 1280, 1000])
def test_the_what_if_panel_says_how_a_mirror_fed_it(browser: Any, width: int) -> None:
    engine = FollowedEngine(num_blocks=NUM_BLOCKS, free_order="uncached_first")
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sender = FakeEngine(engine, endpoint, f"tcp://127.0.0.1:{free_port()}")
    engine.send = sender.offer
    sender.start()
    server = None
    try:
        hello = mirror_setup.wait_hello(endpoint, 30.0)
        settings = make_settings(analysis_mode="inline", shadow_mode="inline")
        app = create_app(mirror_setup.settings_for(hello, settings))
        client = mirror_setup.install(
            app, endpoint, mirror_setup.control_for(endpoint, hello), hello=hello
        )
        server = LiveServer(app, free_port())
        server.start()
        feed = client.what_if
        assert feed is not None
        wait_for(lambda: feed.started, what="the feed started from the engine's beat")
        n = 60
        serial_traffic(engine, n)
        p = Page(browser, server.url, f"mirror-whatif-{width}", {"width": width, "height": 900})
        p.page.locator("#analysis").scroll_into_view_if_needed()
        want = f"fed from {n} mirrored requests' hash chains, free order uncached_first"

        def shown() -> Any:
            foot = p.js("() => document.getElementById('whatif-foot').textContent")
            return foot if want in foot else None

        foot = wait_for(shown, what="the panel's foot says how the shadows were fed")
        assert "prompt blocks only" in foot
        title = p.js("() => document.getElementById('whatif-foot').title")
        assert title.startswith("not fed: 0 skipping the prefix cache")
        rest = httpx.get(server.url + "/api/shadows", timeout=60).json()
        assert rest["fed"]["text"] == want
        want_rows = sorted(
            (s["policy"], s["factor"], s["capacity"], f"{s['hit_rate'] * 100:.1f}%")
            for s in rest["shadows"]
        )
        rows = p.js(ROWS_JS)
        assert sorted((r["policy"], r["factor"], r["capacity"], r["hit"]) for r in rows) == (
            want_rows
        )
        # the baseline is the engine's order at 1x (its delta column: —)
        base = next(r for r in rows if r["policy"] == "uncached_first" and r["factor"] == 1)
        assert base["delta"] == "\N{EM DASH}"
        lines = p.js(LINES_JS)
        assert lines[0][:3] == ["base", "uncached_first", 1]
        assert lines[0][3].startswith(f"Now (1\N{MULTIPLICATION SIGN}, {NUM_BLOCKS - 1} blocks)")
        assert sorted(f for k, pol, f, _ in lines if k == "capacity") == [0.5, 2.0, 4.0]
        assert sorted(pol for k, pol, _, _ in lines if k == "policy") == ["append_all", "s3fifo"]
        # nothing cut off: the foot fits its panel at this width
        fits = p.js(
            """() => { const f = document.getElementById('whatif-foot');
                       const box = f.closest('.panel') || f.parentElement;
                       return f.getBoundingClientRect().right
                              <= box.getBoundingClientRect().right + 1; }"""
        )
        assert fits
        assert p.errors == [] and p.network == [], (p.errors, p.network)
        server.call(server.engine.check)
    finally:
        if server is not None:
            server.stop()
        sender.close()
