"""StreamClient: a websocket client that keeps a PoolReplica exact.

It connects, applies the config, snapshot and deltas, resumes from
``seq + 1`` after a gap (the server answers from its ring buffer, or with a
snapshot when that is gone; one request per gap and second, as the server
budgets them), and reconnects with exponential backoff and jitter, resuming
the same way.  A token travels in the ``Sec-WebSocket-Protocol`` header
(``base64url.bearer.…``), never in the URL.  Used by the tests, by harnesses and as the
reference for the browser code.

    async with StreamClient("ws://127.0.0.1:8000/api/stream") as client:
        await client.wait_until(lambda m: m.seq is not None)
        print(client.replica.queue_order()[:10])
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import websockets
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from app.shared.auth import BEARER_B64_PREFIX, SUBPROTOCOL
from app.stream.protocol import DELTA, Frame, decode
from app.stream.replica import FrameGap, PoolReplica
from blockpool.common.backoff import Backoff


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
        self.replica = PoolReplica()
        self.connects = 0
        self.gaps = 0
        self.frames = 0
        self.bytes = 0
        self.errors: list[str] = []
        self.notices: deque[dict[str, Any]] = deque(maxlen=100)  # the server's text notices
        self.resumes_sent = 0
        self._pending_resume: tuple[int, float] | None = None  # (from, sent at)
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
        m = self.replica
        if m.next_seq is not None and m.epoch is not None:
            q["resume_from"] = str(m.next_seq)
            q["epoch"] = m.epoch
        return self.url + ("?" + urlencode(q) if q else "")

    def subprotocols(self) -> list[str]:
        """``blockpool`` and, with a token, the token as a subprotocol."""
        if not self.token:
            return [SUBPROTOCOL]
        b64 = base64.urlsafe_b64encode(self.token.encode()).decode().rstrip("=")
        return [SUBPROTOCOL, BEARER_B64_PREFIX + b64]

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
        backoff = Backoff(*self.backoff)
        while True:
            try:
                async with websockets.connect(
                    self._connect_url(),
                    max_size=None,
                    open_timeout=5,
                    compression=None,
                    subprotocols=[Subprotocol(x) for x in self.subprotocols()],
                ) as ws:
                    self._ws = ws
                    self._pending_resume = None
                    self.connects += 1
                    backoff.reset()
                    await self._read(ws)
            except (TimeoutError, OSError, ConnectionClosed) as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self._ws = None
            await asyncio.sleep(backoff.failed() * (0.5 + random.random()))

    async def _read(self, ws: Any) -> None:
        async for data in ws:
            while self.paused:
                await asyncio.sleep(0.01)
            if isinstance(data, str):
                with contextlib.suppress(ValueError):
                    self.notices.append(json.loads(data))
                continue
            self.frames += 1
            self.bytes += len(data)
            frame = decode(data)
            if self.lose_deltas and frame.kind == DELTA:
                self.lose_deltas -= 1
                continue
            try:
                self.replica.apply(frame)
            except FrameGap as gap:
                self.gaps += 1
                await self._resume(ws, gap.expected)
                continue
            if self.on_frame is not None:
                self.on_frame(frame)
            self._changed.set()

    async def _resume(self, ws: Any, expected: int) -> None:
        """Ask once per gap (frames still in flight show the same gap) and
        again a second later if nothing came of it."""
        now = time.monotonic()
        pending = self._pending_resume
        if pending is not None and pending[0] == expected and now - pending[1] < 1.0:
            return
        self._pending_resume = (expected, now)
        self.resumes_sent += 1
        await ws.send(json.dumps({"type": "resume", "from": expected}))

    async def wait_until(
        self, predicate: Callable[[PoolReplica], bool], timeout: float = 10.0
    ) -> None:
        """Wait until ``predicate(replica)`` holds (checked after each frame)."""

        async def waiter() -> None:
            while not predicate(self.replica):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(waiter(), timeout)
