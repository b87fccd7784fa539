"""A dashboard on a mirror for the browser tests: an engine followed as the
plugin follows vLLM's pool, its batches sent by the plugin's own sender
thread (blockpool_vllm/sender.py, as tests/mirror/rig.py), and the real app
mirroring it, served by uvicorn in a thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from app.mirror import setup as mirror_setup
from app.mirror.client import MirrorClient
from tests.app.conftest import LiveServer, free_port
from tests.mirror.rig import Rig
from tests.mirror.workload import FollowedEngine
from tests.support.wait import eventually


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
