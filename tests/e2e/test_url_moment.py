"""A moment in the page's URL (/?at=<Unix ms>, as Grafana's data links send
``${__value.time}``), in headless Chromium against a real server: the page
opens in time travel at the op the recording held at that moment (the one
REST's /api/history/state names for it), or says that the moment is outside
the recording and stays live."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from tests.e2e.conftest import Page, Server
from tests.e2e.workload import admit, finish, quiet_moment

pytestmark = pytest.mark.browser

STATES = {"null": 0, "in_use": 1, "cached": 2, "empty": 3}


def open_at(p: Page, server: Server, at: str) -> str:
    """The page opened again with ``?at=``; returns how the URL's moment settled."""
    p.page.goto(f"{server.url}/?at={at}")
    p.page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=120_000)
    p.page.wait_for_function(
        "() => ['shown', 'refused'].includes(document.body.dataset.urlMoment)", timeout=120_000
    )
    return str(p.js("() => document.body.dataset.urlMoment"))


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def test_url_time_opens_time_travel_at_that_moment(dashboard: Page, server: Server) -> None:
    p = dashboard
    before = quiet_moment(server)
    admit(server, random.Random(3).choices(range(32000), k=16 * 40), "url-at")  # after `before`
    t_before = server.get(f"/api/history/state?at={before}&limit=1")["at"]["ts"]
    t_next = server.get(f"/api/history/state?at={before + 1}&limit=1")["at"]["ts"]
    assert t_next > t_before
    # a clicked time between op `before` and the next one, in ms as Grafana sends it
    at_ms = int((t_before + t_next) * 500)
    assert t_before <= at_ms / 1000 < t_next
    rest = server.get(f"/api/history/state?at={at_ms / 1000}&include_blocks=true&limit=1")
    assert rest["at"]["seq"] == before  # the recording's moment for that time

    assert open_at(p, server, str(at_ms)) == "shown"
    assert p.js("() => document.body.dataset.mode") == "history"
    assert p.js("() => document.getElementById('history-banner').dataset.seq") == str(before)
    assert p.js("() => window.__bp.history.state.at.seq") == before
    assert p.js("() => window.__bp.history.state.at.ts") == pytest.approx(t_before)
    # the moment asked for is in the jump box (ISO, UTC), the one shown in the banner
    box = p.js("() => document.getElementById('tl-jump').value")
    assert box.replace("Z", "+00:00") == iso_ms(at_ms)
    assert f"op {before:,}" in p.js("() => document.getElementById('history-text').textContent")
    # the map draws the recorded pool, not the live one (the request holds blocks now)
    drawn = p.js("() => Array.from(window.__bp.history.src.state)")
    assert drawn == [STATES[s] for s in rest["blocks"]["state"]]
    live = p.js("() => Array.from(window.__bp.model.state)")
    assert sum(a != b for a, b in zip(drawn, live, strict=True)) >= 40
    finish(server, "url-at")
    assert p.errors == [], p.errors


def test_url_time_outside_the_recording_is_said_and_the_page_stays_live(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    first_ts = server.get("/api/history")["first_ts"]
    at_ms = int((first_ts - 3600) * 1000)  # an hour before the service's first op
    assert open_at(p, server, str(at_ms)) == "refused"
    assert p.js("() => document.body.dataset.mode") != "history"
    assert p.js("() => window.__bp.history.active") is False
    error = p.js("() => document.getElementById('tl-jump').dataset.error")
    assert error.startswith(f"{iso_ms(at_ms).replace('+00:00', 'Z')} is outside the recording")
    assert "before it" in error
    assert error in p.js("() => document.getElementById('tl-at').textContent")
    # not a moment at all: refused with the reason, nothing asked of the server
    assert open_at(p, server, "yesterday") == "refused"
    assert "is not a moment" in p.js("() => document.getElementById('tl-jump').dataset.error")
    assert p.js("() => window.__bp.history.active") is False
    assert p.errors == [], p.errors
