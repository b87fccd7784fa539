"""The observer's live websocket: one JSON message per tick, shared by all.

Every ``1/tick_hz`` seconds, when something changed (or once a second as a
heartbeat), the hub builds ONE message -- the health of every pool and the
events applied since the last tick -- encodes it once and puts the same text
on every client's bounded queue without awaiting.  A client whose queue is
full loses its queue and is sent ``{"type": "resync"}``: it should re-read
the REST views.  Messages carry consecutive ``seq`` numbers per hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from app.observer.fleet import Fleet
from app.observer.source import Source
from blockpool.kvevents.event_json import event_json

logger = logging.getLogger("blockpool.observer")

MAX_EVENTS_PER_TICK = 500
HEARTBEAT_S = 1.0


class Client:
    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[str] = asyncio.Queue(maxsize)
        self.dropped = 0


class FleetHub:
    def __init__(self, fleet: Fleet, tick_hz: float = 5.0, queue_size: int = 64) -> None:
        self.fleet = fleet
        self.period = 1.0 / tick_hz
        self.queue_size = queue_size
        self.clients: set[Client] = set()
        self.seq = 0
        self.messages = 0
        self.clients_dropped = 0
        self.tick_errors = 0
        self._error_logged_at = -1e9
        self._dirty = True
        self._sent_log_seq = {name: 0 for name in fleet.sources}
        self._task: asyncio.Task[None] | None = None
        for s in fleet.sources.values():
            s.on_batch = self._mark

    def _mark(self, _: Source) -> None:
        self._dirty = True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="observer-hub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        last_sent = 0.0
        while True:
            await asyncio.sleep(self.period)
            now = time.monotonic()
            if not self._dirty and now - last_sent < HEARTBEAT_S:
                continue
            try:
                self.broadcast(self.tick_message())
            except Exception:  # a bug must not stop the hub: counted, logged once a minute
                self.tick_errors += 1
                if now - self._error_logged_at > 60.0:
                    self._error_logged_at = now
                    logger.exception("observer hub tick failed (%d so far)", self.tick_errors)
            last_sent = now

    def tick_message(self) -> dict[str, Any]:
        """The next tick's message (advances the hub's seq and cursors)."""
        self._dirty = False
        self.seq += 1
        events: list[dict[str, Any]] = []
        omitted = 0
        for name, s in self.fleet.sources.items():
            since = self._sent_log_seq.get(name, 0)
            if s.log.last_seq < since:  # pragma: no cover - logs only grow
                since = 0
            entries, _ = s.log.since(since, MAX_EVENTS_PER_TICK)
            omitted += max(0, s.log.last_seq - since - len(entries))
            # keep the newest when there are too many for one message
            if s.log.last_seq - since > MAX_EVENTS_PER_TICK:
                entries, _ = s.log.since(s.log.last_seq - MAX_EVENTS_PER_TICK, MAX_EVENTS_PER_TICK)
            for seq, ts, item in entries:
                ev = event_json(seq, ts, item)
                ev["instance"] = name
                events.append(ev)
            self._sent_log_seq[name] = s.log.last_seq
        events.sort(key=lambda e: e["ts"])
        return {
            "type": "tick",
            "seq": self.seq,
            "ts": time.time(),
            "instances": [s.health() for s in self.fleet.sources.values()],
            "events": events,
            "events_omitted": omitted,
        }

    def hello(self) -> dict[str, Any]:
        return {
            "type": "hello",
            "seq": self.seq,
            "ts": time.time(),
            "instances": [s.health() for s in self.fleet.sources.values()],
        }

    def broadcast(self, message: dict[str, Any]) -> None:
        text = json.dumps(message, separators=(",", ":"), allow_nan=False)
        self.messages += 1
        for client in list(self.clients):
            try:
                client.queue.put_nowait(text)
            except asyncio.QueueFull:
                client.dropped += 1
                self.clients_dropped += 1
                while not client.queue.empty():
                    client.queue.get_nowait()
                client.queue.put_nowait(
                    json.dumps({"type": "resync", "seq": message.get("seq", self.seq)})
                )

    def add(self) -> Client:
        client = Client(self.queue_size)
        self.clients.add(client)
        return client

    def remove(self, client: Client) -> None:
        self.clients.discard(client)
