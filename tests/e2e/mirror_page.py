"""A dashboard on a mirror for the browser tests: an engine followed as the
plugin follows vLLM's pool, its batches sent by the plugin's own sender
thread (blockpool_vllm/sender.py, as tests/mirror/rig.py), and the real app
mirroring it, served by uvicorn in a thread; ``told_mirror``: one that has
also been told of requests under vLLM-shaped ids of client requests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from app.mirror import setup as mirror_setup
from app.mirror.client import MirrorClient
from blockpool.mirror.protocol import Arrive, Finished, Scheduled
from tests.app.conftest import LiveServer, free_port
from tests.e2e.conftest import Page, wait_for
from tests.mirror.rig import Rig
from tests.mirror.workload import BLOCK, FollowedEngine
from tests.support.wait import CLIENT_TIMEOUT, eventually

WIDTHS = (1600, 1280, 1000)  # the page's widths each mirror page test runs at


@dataclass
class Mirrored:
    rig: Rig
    server: LiveServer
    client: MirrorClient

    @property
    def engine(self) -> FollowedEngine:
        return self.rig.engine

    def caught_up(self) -> bool:
        return bool(self.server.call(lambda: self.rig.caught_up(self.client)))

    def drive(self, steps: int) -> None:
        """``steps`` engine steps, then until the mirror applied them all."""
        self.engine.drive(steps)
        eventually(self.caught_up, what="the mirror caught up with the engine")

    def silence(self) -> None:
        """The engine's plugin says nothing more (a dead or hung engine)."""
        self.rig.close()


@contextlib.contextmanager
def mirrored(num_blocks: int = 64, free_order: str = "uncached_first") -> Iterator[Mirrored]:
    """A served mirror of an engine telling of its requests; the mirror's
    invariants checked at the end."""
    rig = Rig(free_order, num_blocks=num_blocks)
    rig.engine.tell_requests = True
    rig.engine.admit_alone = True
    rig.start()
    server = None
    try:
        hello = mirror_setup.wait_hello(rig.endpoint, 30.0, rig.mirror_key)
        app, client = rig.service(hello)
        server = LiveServer(app, free_port())
        server.start()
        m = Mirrored(rig, server, client)
        # in step before the engine steps: a snapshot taken while it stepped
        # covers batches whose requests would be classified after the fact
        eventually(m.caught_up, what="the mirror in step with the engine")
        yield m
        server.call(server.engine.check)
        rig.engine.rt.check()
    finally:
        if server is not None:
            server.stop()
        rig.close()


def walk_values(p: Any) -> dict[str, Any]:
    """Every tile's text (by ``data-h``/id), for a test's failure message."""
    return dict(
        p.js(
            """() => Object.fromEntries([...document.querySelectorAll('[data-h], .tile')]
              .map((e, i) => [e.dataset.h || e.id || String(i), e.textContent.trim()]))"""
        )
    )


# vLLM's internal ids of client requests (see app/mirror/story.py):
# {k}_ before a sample's id when n > 1, -{prompt} and 8 hex characters after the client's id
TOLD = {
    "cmpl-7f3e-0-a7acb6a5": 2 * BLOCK,  # one prompt, n = 1
    "0_chatcmpl-55aa-0c1d2e3f": BLOCK,  # n = 2: two samples of one client request
    "1_chatcmpl-55aa-0c1d2e3f": 0,
}


def _tell_client_ids(m: Mirrored) -> None:
    """Requests under vLLM-shaped ids (told, scheduled and finished, as the plugin would)."""
    engine = m.engine
    rid0 = next(iter(engine.rt.manager.requests))
    hashes = [bytes(h) for h in engine.rt.manager.requests[rid0].block_hashes]
    n = len(hashes) * BLOCK + 1
    now = time.time()
    for i, (rid, hit) in enumerate(TOLD.items()):
        engine.follower.request(Arrive(rid, now + i, n, hashes))
        engine.follower.request(Scheduled(rid, now + i, hit))
        engine.follower.request(Finished(rid, now + i + 1, n + 3))
    engine.follower.flush()
    wait_for(lambda: all(r in m.client.book.requests for r in TOLD), what="the ids told")


@contextlib.contextmanager
def told_mirror() -> Iterator[Mirrored]:
    """A mirror 400 steps in, told of ``TOLD``'s requests, ending with
    requests running (the walk compares them)."""
    with mirrored() as m:
        m.drive(400)
        _tell_client_ids(m)
        m.drive(20)
        for _ in range(500):
            if len(m.engine.rt.manager.requests) >= 2:
                break
            m.drive(1)
        yield m


def open_page(browser: Any, m: Mirrored, name: str, width: int) -> Page:
    """The dashboard on ``m``, once it knows it is a mirror's."""
    p = Page(browser, m.server.url, name, viewport={"width": width, "height": 1000})
    wait_for(lambda: p.js("() => document.body.dataset.mirror") == "1", what="the page a mirror's")
    return p


def rest_json(m: Mirrored, path: str) -> Any:
    r = httpx.get(m.server.url + path, timeout=CLIENT_TIMEOUT)
    r.raise_for_status()
    return r.json()
