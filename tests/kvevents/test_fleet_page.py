"""The fleet page in headless Chromium against a real ``blockpool observe``
process following two publishers.  Never skipped: fails when Chromium or the
observer cannot run."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from blockpool.kvevents.config import KVEventsConfig
from blockpool.kvevents.publisher import KVEventPublisher
from tests.chromium import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.kvevents.helpers import FakePublisher, Workload, positional, vllm_current, wait_for
from tests.support.cli import start_cli_observer, stop_cli_server
from tests.support.ports import free_port
from tests.support.wait import CLIENT_TIMEOUT

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "kvevents"


class Fed:
    """A publisher fed by a seeded workload on a real pool."""

    def __init__(self, seed: int, prefixes: list[list[int]] | None = None) -> None:
        self.work = Workload(seed=seed, num_blocks=64, lora=False)
        if prefixes is not None:
            self.work.prefixes = prefixes
        self.pub = KVEventPublisher(
            KVEventsConfig(endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*")
        )
        self.pub.start()

    def steps(self, n: int) -> None:
        for _ in range(n):
            evs = self.work.step()
            if evs:
                self.pub.publish_events(time.time(), evs)

    def published(self) -> int:
        return self.pub.last_published_seq


def last_seqs(url: str) -> dict[str, int | None]:
    fleet = httpx.get(url + "/api/fleet", timeout=10).json()
    return {i["name"]: i["last_seq"] for i in fleet["instances"]}


@pytest.fixture
def observed() -> Iterator[tuple[str, dict[str, Fed]]]:
    a = Fed(81)
    b = Fed(82, a.work.prefixes)
    feds = {"alpha": a, "beta": b}
    a.steps(40)  # published before the observer starts: it joins via replay
    port = free_port()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log = ARTIFACTS / "observer.log"
    cmd = ["--log-level", "warning"]
    for name, fed in feds.items():
        cmd += [f"{name}={fed.pub.bound_endpoint}"]
    cmd += [f"ghost=tcp://127.0.0.1:{free_port()}"]  # nothing binds there
    hybrid = FakePublisher()  # a hybrid model's two KV-cache groups, current vLLM's format
    cmd += [f"hybrid={hybrid.endpoint}"]
    gone = FakePublisher()  # sends one batch, then its process is gone: stale
    cmd += [f"gone={gone.endpoint}"]
    for fed in feds.values():
        cmd += ["--replay", fed.pub.bound_replay_endpoint or "none"]
    cmd += ["--replay", "none", "--replay", "none", "--replay", "none"]
    url = f"http://127.0.0.1:{port}"
    proc = None
    try:
        proc = start_cli_observer(port, log, *cmd, env={"BLOCKPOOL_OBSERVER_SILENCE_S": "1"})

        def connected() -> bool:
            assert proc.poll() is None, f"blockpool observe exited: see {log}"
            return bool(
                httpx.get(url + "/api/health", timeout=CLIENT_TIMEOUT).json()["connected"] == 4
            )

        wait_for(connected, what="the observer to connect to its four live sources")
        # a SUB misses what its PUB sent before the subscription reached it (the
        # slow joiner): publish one batch at a time until each source has heard
        # one (its replay then fills the rest), then the rest
        deadline = time.monotonic() + 30
        while unheard := [n for n, last in last_seqs(url).items() if n in feds and last is None]:
            if time.monotonic() > deadline:
                pytest.fail(f"the observer heard nothing from {unheard}: see {log}")
            for name in unheard:
                feds[name].steps(1)
            time.sleep(0.05)
        b.steps(30)
        a.steps(10)
        hybrid.wait_subscribed()
        full, window = Workload(seed=83, lora=False), Workload(seed=84, lora=False)
        window.prefixes = full.prefixes
        seq = 0
        for _ in range(20):
            for g, w in ((0, full), (1, window)):
                evs = w.step()
                if evs:
                    kind, win = ("full_attention", None) if g == 0 else ("sliding_window", 8)
                    hybrid.send(seq, vllm_current(evs, g, kind, win))
                    seq += 1
        gone.wait_subscribed()
        gone.send(0, positional(Workload(seed=85, lora=False).batches(1)[0]))
        wait_for(lambda: last_seqs(url)["gone"] == 0, 20, "the gone publisher's batch")
        gone.close()
        yield url, feds
    finally:
        if proc is not None:
            stop_cli_server(proc)
        hybrid.close()
        gone.close()
        for fed in feds.values():
            fed.pub.stop()
            fed.work.check()


def synced(url: str, feds: dict[str, Fed]) -> bool:
    fleet = httpx.get(url + "/api/fleet", timeout=5).json()
    last = {i["name"]: i["last_seq"] for i in fleet["instances"]}
    return all(last[name] == fed.published() for name, fed in feds.items())


@pytest.mark.browser
def test_fleet_page_shows_both_instances_and_their_hashes(
    observed: tuple[str, dict[str, Fed]],
) -> None:
    url, feds = observed
    wait_for(lambda: synced(url, feds), 20, "the observer to catch up")
    require_chromium()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1100})
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))

            def console(m: Any) -> None:
                if m.type == "error":
                    errors.append(f"console: {m.text}")

            page.on("console", console)
            page.goto(url + "/")
            check_page(page, url, feds)
            page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []


def check_page(page: Any, url: str, feds: dict[str, Fed]) -> None:
    page.wait_for_selector("#instances .instance >> nth=1", timeout=20_000)
    names = page.eval_on_selector_all("#instances .instance", "els => els.map(e => e.dataset.name)")
    assert names == ["alpha", "beta", "ghost", "hybrid", "gone"]
    # the hybrid instance's KV-cache groups, with their specs and blocks
    page.wait_for_selector('#instances .instance[data-name="hybrid"] .group[data-group="1"]')
    groups = page.inner_text('#instances .instance[data-name="hybrid"] .groups')
    health = httpx.get(f"{url}/api/fleet/hybrid").json()
    assert "g0 full_attention" in groups and "g1 sliding_window (window 8)" in groups
    assert set(health["groups"]) == {"0", "1"}
    assert page.query_selector_all('#instances .instance[data-name="alpha"] .groups') == []
    # the silent one says what to check; the fed ones say nothing of the kind
    page.wait_for_function(
        "() => { const n = document.querySelector("
        "'#instances .instance[data-name=\"ghost\"] .reason.silence');"
        " return n && n.textContent.includes('never connected'); }",
        timeout=20_000,
    )
    ghost = page.inner_text('#instances .instance[data-name="ghost"] .reason.silence')
    assert "bind" in ghost and "connect" in ghost
    assert page.query_selector_all("#instances .instance:not([data-name='ghost']) .silence") == []
    # the one whose publisher went away after data: stale, with what that means
    page.wait_for_selector('#instances .instance[data-name="gone"] .badge.stale', timeout=30_000)
    gone = page.inner_text('#instances .instance[data-name="gone"] .reason.stale')
    assert "no message for" in gone and "connection to" in gone and "closed" in gone
    assert page.query_selector_all('#instances .instance[data-name="gone"] .badge.exact') == []
    assert page.query_selector_all("#instances .instance:not([data-name='gone']) .stale") == []
    assert httpx.get(f"{url}/api/health").json()["stale"] == ["gone"]
    page.wait_for_function(
        "() => document.getElementById('fleet-facts').textContent.includes('1 stale')"
    )
    names = ["alpha", "beta"]
    assert page.is_visible("#cannot-know")
    banner = page.inner_text("#cannot-know")
    assert "cannot know" in banner and "block ids" in banner and "reference counts" in banner
    for name in names:
        page.click(f'#instances .instance[data-name="{name}"]')
        page.wait_for_function(
            "n => document.getElementById('hm-instance').textContent === n", arg=name
        )
        truth = httpx.get(f"{url}/api/fleet/{name}/hashmap", params={"limit": 50}).json()
        assert truth["total_keys"] > 0
        want = [i["hash"] for i in truth["items"]]
        page.wait_for_function(
            "want => { const rows = [...document.querySelectorAll('#hashmap tbody tr[data-hash]')];"
            " return rows.length === want.length"
            " && rows.every((r, k) => r.dataset.hash === want[k]); }",
            arg=want,
            timeout=20_000,
        )
        card = page.inner_text(f'#instances .instance[data-name="{name}"]')
        assert "exact" in card and f"keys {truth['total_keys']:,}" in card
        page.wait_for_selector("#tree li[data-hash]", timeout=20_000)
    # search narrows the table to the hash
    one = want[3 % len(want)]
    page.fill("#hm-search", one[:12])
    page.wait_for_function(
        "h => { const rows = document.querySelectorAll('#hashmap tbody tr[data-hash]');"
        " return rows.length >= 1 && [...rows].some(r => r.dataset.hash === h); }",
        arg=one,
    )
    # a row click asks the fleet who holds that prefix
    page.click(f'#hashmap tbody tr[data-hash="{one}"]')
    page.wait_for_selector("#fp-result .bar >> nth=1")
    bars = page.eval_on_selector_all("#fp-result .bar", "els => els.map(e => e.dataset.instance)")
    assert sorted(bars) == ["alpha", "beta", "ghost", "gone", "hybrid"]
    width = page.eval_on_selector("#fp-result .bar .fill", "e => e.getBoundingClientRect().width")
    assert width > 0
    page.wait_for_selector("#families tbody tr[data-root]")
    # live events reach the log
    page.check("#ev-selected")
    before = len(page.query_selector_all("#events .ev"))
    feds["beta"].steps(10)
    page.wait_for_function(
        "n => document.querySelectorAll('#events .ev').length > n", arg=before, timeout=20_000
    )
    assert page.get_attribute("#stream-state", "data-state") == "open"
    assert "NaN" not in page.inner_text("body") and "undefined" not in page.inner_text("body")


SNAPSHOT_READS = re.compile(r"/api/fleet/[^/?]+/(snapshot|hashmap|prefix-tree)\b")


@pytest.mark.browser
def test_fleet_page_follows_the_stream_and_rereads_only_on_a_gap(
    observed: tuple[str, dict[str, Fed]],
) -> None:
    """The selected instance's hash map and tree: one snapshot, then the
    stream's events alone (no REST read however many come); events lost on
    the way (a tick without them, or a whole tick) read it again, once.
    (A gap in the events' own seq: frontend/tests/fleetsync.test.mjs.)"""
    url, feds = observed
    wait_for(lambda: synced(url, feds), 20, "the observer to catch up")
    require_chromium()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    reads: list[str] = []
    # what the route does to the next tick carrying beta's events: "strip"
    # them (the tick goes on, its seq intact) or "drop" the whole tick
    lose: dict[str, Any] = {"how": None, "done": 0}

    def route(ws: Any) -> None:
        server = ws.connect_to_server()

        def from_server(message: str | bytes) -> None:
            if lose["how"] and isinstance(message, str):
                msg = json.loads(message)
                events = msg.get("events") or []
                if any(e["instance"] == "beta" for e in events):
                    how, lose["how"] = lose["how"], None
                    lose["done"] += 1
                    if how == "drop":
                        return
                    msg["events"] = [e for e in events if e["instance"] != "beta"]
                    message = json.dumps(msg)
            ws.send(message)

        server.on_message(from_server)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1100})
            page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on(
                "request", lambda r: reads.append(r.url) if SNAPSHOT_READS.search(r.url) else None
            )
            page.route_web_socket("**/api/fleet/stream", route)
            page.goto(url + "/?instance=beta")
            page.wait_for_function(
                "() => document.getElementById('stream-state').dataset.state === 'open'"
            )
            follows(page, url, "beta")
            assert [r.split("?")[0] for r in reads] == [f"{url}/api/fleet/beta/snapshot"]
            assert "snapshot reads 1 (last: selected)" in page.inner_text("#sync-state")

            # events flow: the views follow them, REST is not read
            before = {i["hash"] for i in snapshot_of(url, "beta")["items"]}
            feds["beta"].steps(12)
            wait_for(lambda: synced(url, feds), 20, "the observer to apply beta's batches")
            truth = follows(page, url, "beta")
            new = [i["hash"] for i in truth["items"] if i["hash"] not in before]
            assert new, "the steps stored new hashes"
            page.fill("#hm-search", new[-1])
            page.wait_for_selector(f'#hashmap tbody tr[data-hash="{new[-1]}"]')
            page.fill("#hm-search", "")
            assert len(reads) == 1, reads
            assert "snapshot reads 1 " in page.inner_text("#sync-state")

            # a tick loses beta's events: the health it carries says the log
            # is ahead of the page's copy, which reads again
            lose["how"] = "strip"
            feds["beta"].steps(4)
            pumped_until(page, lambda: lose["done"] == 1, "a tick with beta's events")
            page.wait_for_function(
                "() => document.getElementById('sync-state').textContent"
                ".includes('snapshot reads 2 (last: behind the log)')",
                timeout=20_000,
            )
            wait_for(lambda: synced(url, feds), 20, "the observer to apply beta's batches")
            follows(page, url, "beta")
            feds["beta"].steps(4)  # and then follows the events again, no read
            wait_for(lambda: synced(url, feds), 20, "the observer to apply beta's batches")
            follows(page, url, "beta")
            assert len(reads) == 2, reads

            # a whole tick lost (the hub's seq skips): a resync, read again
            lose["how"] = "drop"
            feds["beta"].steps(4)
            pumped_until(page, lambda: lose["done"] == 2, "a tick with beta's events")
            page.wait_for_function(
                "() => document.getElementById('sync-state').textContent"
                ".includes('snapshot reads 3 (last: resync)')",
                timeout=20_000,
            )
            assert "1 resync" in page.inner_text("#stream-state")
            wait_for(lambda: synced(url, feds), 20, "the observer to apply beta's batches")
            follows(page, url, "beta")
            assert [r.split("?")[0] for r in reads] == [f"{url}/api/fleet/beta/snapshot"] * 3
        finally:
            browser.close()
    assert errors == []


def pumped_until(page: Any, pred: Callable[[], bool], what: str, timeout: float = 20) -> None:
    """Wait for ``pred`` while Playwright's loop runs (the websocket route's
    handler is called only then; a plain sleep would starve it)."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        page.wait_for_timeout(20)


def snapshot_of(url: str, name: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/api/fleet/{name}/snapshot", timeout=10).json())


def follows(page: Any, url: str, name: str) -> dict[str, Any]:
    """Wait until the page's hash map and tree are the observer's map (its
    counts, its first page of rows, the tree's size); the observer's snapshot."""
    truth = snapshot_of(url, name)
    keys, blocks = truth["total_keys"], truth["blocks"]
    multi = sum(1 for i in truth["items"] if i["copies"] > 1)
    want = [i["hash"] for i in truth["items"][:50]]
    page.wait_for_function(
        """([keys, blocks, want]) => {
             const foot = document.getElementById('hm-page').textContent;
             const rows = [...document.querySelectorAll('#hashmap tbody tr[data-hash]')];
             const tree = document.getElementById('tree-info').textContent;
             return foot.includes(`(${keys} keys, ${blocks} blocks)`)
               && rows.length === want.length && rows.every((r, k) => r.dataset.hash === want[k])
               && tree.startsWith(`${keys} cached prefixes`); }""",
        arg=[f"{keys:,}", f"{blocks:,}", want],
        timeout=20_000,
    )
    page.check("#hm-multi")
    page.wait_for_function(
        "n => document.getElementById('hm-page').textContent.includes(` of ${n} (`)",
        arg=f"{multi:,}",
    )
    page.uncheck("#hm-multi")
    return truth
