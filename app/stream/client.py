"""StreamClient: a websocket client that keeps a PoolMirror exact.

It connects, applies the config, snapshot and deltas, resumes from
``seq + 1`` after a gap (the server answers from its ring buffer, or with a
snapshot when that is gone), and reconnects with exponential backoff and
jitter, resuming the same way.  Used by the tests, by harnesses and as the
reference for the browser code.

    async with StreamClient("ws://127.0.0.1:8000/api/stream") as client:
        await client.wait_until(lambda m: m.seq is not None)
        print(client.mirror.queue_order()[:10])
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import websockets
from websockets.exceptions import ConnectionClosed

from app.stream.mirror import Gap, PoolMirror
from app.stream.protocol import DELTA, Frame, decode


class StreamClient:
    def __init__(
        self,
        url: str,
        *,
        channels: list[str] | None = None,
        token: str | None = None,
        backoff: tuple[float, float] = (0.05, 5.0),
        on_frame: Callable[[Frame], None] | None = None,
        compress: bool = True,
    ) -> None:
        self.url = url
        self.channels = channels
        self.token = token
        self.backoff = backoff
        self.on_frame = on_frame
        self.compress = compress
        self.mirror = PoolMirror()
        self.connects = 0
        self.gaps = 0
        self.frames = 0
        self.bytes = 0
        self.errors: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._ws: Any = None
        self.paused = False  # tests: stop reading (a stalled client)
        self.lose_deltas = 0  # tests: drop the next N deltas as if lost in transit

    def _connect_url(self) -> str:
        q: dict[str, str] = {}
        if self.compress:
            q["compress"] = "zlib"
        if self.channels:
            q["channels"] = ",".join(self.channels)
        if self.token:
            q["token"] = self.token
        m = self.mirror
        if m.next_seq is not None and m.epoch is not None:
            q["resume_from"] = str(m.next_seq)
            q["epoch"] = m.epoch
        return self.url + ("?" + urlencode(q) if q else "")

    async def __aenter__(self) -> StreamClient:
        self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="stream-client")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def drop_connection(self) -> None:
        """Close the socket as if the network failed (it reconnects)."""
        if self._ws is not None:
            await self._ws.close()

    async def _run(self) -> None:
        delay = self.backoff[0]
        while True:
            try:
                async with websockets.connect(
                    self._connect_url(), max_size=None, open_timeout=5, compression=None
                ) as ws:
                    self._ws = ws
                    self.connects += 1
                    delay = self.backoff[0]
                    await self._read(ws)
            except (TimeoutError, OSError, ConnectionClosed) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self._ws = None
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, self.backoff[1])

    async def _read(self, ws: Any) -> None:
        async for data in ws:
            while self.paused:
                await asyncio.sleep(0.01)
            if isinstance(data, str):
                continue
            self.frames += 1
            self.bytes += len(data)
            frame = decode(data)
            if self.lose_deltas and frame.kind == DELTA:
                self.lose_deltas -= 1
                continue
            try:
                self.mirror.apply(frame)
            except Gap as gap:
                self.gaps += 1
                await ws.send(json.dumps({"type": "resume", "from": gap.expected}))
                continue
            if self.on_frame is not None:
                self.on_frame(frame)
            self._changed.set()

    async def wait_until(
        self, predicate: Callable[[PoolMirror], bool], timeout: float = 10.0
    ) -> None:
        """Wait until ``predicate(mirror)`` holds (checked after each frame)."""

        async def waiter() -> None:
            while not predicate(self.mirror):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(waiter(), timeout)
