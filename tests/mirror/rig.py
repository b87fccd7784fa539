"""The rig of the ``serve --mirror`` tests: an engine followed as the plugin
follows vLLM's pool, its batches sent by the plugin's own sender thread
(blockpool_vllm/sender.py: signed PUB, ROUTER snapshots), and the real app
mirroring it; waiting on conditions, reading /metrics; holding the mirror's
processor (``gate``) and driving the engine until the mirror is exact
(``exact_now``)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.mirror import setup as mirror_setup
from app.mirror.client import MirrorClient
from blockpool.mirror.auth import StreamKey
from blockpool.mirror.protocol import DigestReading, Hello
from blockpool_vllm.sender import Sender
from tests.app.conftest import free_port, make_settings
from tests.mirror.workload import FollowedEngine

SECRET = StreamKey(b"the engine's secret, 32 chars ok")
OTHER = StreamKey(b"another secret, 32 characters ok")


class Rig:
    def __init__(
        self,
        free_order: str,
        key: StreamKey | None = None,
        mirror_key: StreamKey | None = None,
        num_blocks: int = 64,
    ) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.control_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.key = key  # the engine's secret
        self.mirror_key = mirror_key if mirror_key is not None else key  # the mirror's
        self.engine = FollowedEngine(num_blocks=num_blocks, free_order=free_order)
        # what the plugin's handshakes and beats say of its digest's progress
        # (this engine's digest is read on its own thread: nothing, unless set)
        self.reading: DigestReading | None = None
        self.sender = self._sender()

    def _sender(self) -> Sender:
        """The plugin's sender for this engine (a new boot: a new run of the plugin)."""
        boot = os.urandom(8).hex()
        engine, key = self.engine, self.key
        engine.follower.boot = boot

        def hello() -> Hello:
            h = engine.hello(sender.control_port)
            return msgspec.structs.replace(h, boot=boot, authenticated=key is not None)

        sender = Sender(
            self.endpoint,
            hello,
            engine.follower.poll_snapshot,
            engine.stats,
            cost_us=engine.follower.cost_quantiles,
            reading=lambda: self.reading,
            control_endpoint=self.control_endpoint,
            key=key,
            retry_s=0.05,
            snapshot_every_s=0.1,
        )
        engine.send = sender.offer
        return sender

    def start(self) -> None:
        """The engine side started; ports another process took meanwhile are
        exchanged for others (free_port's answer is only a likely one)."""
        for _ in range(20):
            if self.sender.start():
                return
            self.sender.close()
            self.endpoint = f"tcp://127.0.0.1:{free_port()}"
            self.control_endpoint = f"tcp://127.0.0.1:{free_port()}"
            self.sender = self._sender()
        raise AssertionError("no free ports for the engine")

    def close(self) -> None:
        self.sender.close()

    def restart(self, num_blocks: int = 64, free_order: str | None = None) -> FollowedEngine:
        """The engine gone and another started on the same ports (a new boot)."""
        self.sender.close()
        order = free_order or self.engine.free_order
        self.engine = FollowedEngine(num_blocks=num_blocks, free_order=order)
        self.engine.rng.seed(11)
        # the closed sockets' ports are let go by ZMQ's I/O thread, soon: the
        # sender retries its bind until they are
        self.sender = self._sender()
        self.sender.start()
        return self.engine

    async def hello(self) -> Hello:
        return await anyio.to_thread.run_sync(
            mirror_setup.wait_hello, self.endpoint, 30.0, self.mirror_key
        )

    async def hello_saying(self, says: Callable[[Hello], bool]) -> Hello:
        """The engine's handshake once it says what the test just set (one
        built before may still be on its way): at most five handshakes."""
        hello = await self.hello()
        for _ in range(4):
            if says(hello):
                break
            hello = await self.hello()
        return hello

    def service(
        self, hello: Hello, rebuild: Callable[[Hello], None] | None = None, **overrides: Any
    ) -> tuple[FastAPI, MirrorClient]:
        """The real app, mirroring this engine (settings: the handshake's;
        ``rebuild``: told the handshake of an engine restarted as another pool)."""
        app = create_app(mirror_setup.settings_for(hello, make_settings(**overrides)))
        control = mirror_setup.control_for(self.endpoint, hello)
        client = mirror_setup.install(
            app, self.endpoint, control, self.mirror_key, hello, rebuild=rebuild
        )
        return app, client

    async def drive(self, client: MirrorClient, rounds: int, steps: int) -> None:
        """``rounds`` times ``steps`` engine steps, then until the mirror caught up."""
        await until(lambda: self.caught_up(client))
        for _ in range(rounds):
            self.engine.drive(steps)
            await anyio.sleep(0)
        await until(lambda: self.caught_up(client))

    def caught_up(self, client: MirrorClient) -> bool:
        """The mirror applied every operation the engine did."""
        f = self.engine.follower
        return client.applier.synced and client.applier.next_op == f.op_count == f.first_op


def metric(text: str, name: str) -> float:
    """The value of one sample of ``name`` (any labels) in a Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


async def until(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        await anyio.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def gate(client: MirrorClient, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Hold the mirror's processor before it handles its next group (the
    reader goes on taking frames): set the event to let it go."""
    go = asyncio.Event()
    handle: Callable[[Any], Awaitable[None]] = client._handle_group

    async def held(opened: Any) -> None:
        await go.wait()
        await handle(opened)

    monkeypatch.setattr(client, "_handle_group", held)
    return go


async def exact_now(rig: Rig, client: MirrorClient) -> None:
    """Drive the engine until the mirror caught up and a digest matched since its sync."""

    def proved() -> bool:
        if not (rig.caught_up(client) and client.status.digests_checked_since_sync > 0):
            rig.engine.drive(1)
            return False
        return True

    await until(proved)
    await until(lambda: client.status.as_dict()["exact"])
