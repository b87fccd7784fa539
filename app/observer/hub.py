"""The observer's live websocket: one JSON message per tick, shared by all.

Every ``1/tick_hz`` seconds, when something changed (or once a second as a
heartbeat), the hub builds ONE message -- the health of every pool and the
events applied since the last tick -- encodes it once and puts the same text
on every client's bounded queue without awaiting.  A client whose queue is
full loses its queue and is sent ``{"type": "resync"}``: it should re-read
the REST views (``app/web/broadcast.py``, counted in ``counts``).  Messages
carry consecutive ``seq`` numbers per hub.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from app.observer.fleet import Fleet
from app.observer.source import Source
from app.shared.tasks import cancel_and_wait
from app.web.broadcast import BroadcastCounts, Broadcaster, Subscriber
from blockpool.common.figures import counter, helps, totals
from blockpool.kvevents.event_json import event_json

logger = logging.getLogger("blockpool.observer")

MAX_EVENTS_PER_TICK = 500
HEARTBEAT_S = 1.0


@dataclass
class HubCounts(BroadcastCounts):
    messages: int = counter("Tick messages encoded (once each, for every client).")
    tick_errors: int = counter("Ticks that failed to build (the hub goes on).")


HUB_HELP = helps(HubCounts)


class FleetHub:
    def __init__(self, fleet: Fleet, tick_hz: float = 5.0, queue_size: int = 64) -> None:
        self.fleet = fleet
        self.period = 1.0 / tick_hz
        self.queue_size = queue_size
        self.counts = HubCounts()
        self.fan: Broadcaster[str] = Broadcaster(self.counts)
        self.seq = 0
        self._error_logged_at = -1e9
        self._dirty = True
        self._sent_log_seq = dict.fromkeys(fleet.sources, 0)
        self._task: asyncio.Task[None] | None = None
        for s in fleet.sources.values():
            s.on_batch = self._mark

    def _mark(self, _: Source) -> None:
        self._dirty = True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="observer-hub")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

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
                self.counts.tick_errors += 1
                if now - self._error_logged_at > 60.0:
                    self._error_logged_at = now
                    logger.exception(
                        "observer hub tick failed (%d so far)", self.counts.tick_errors
                    )
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
        """Encode ``message`` once and queue it for every client; one too slow
        for it gets ``{"type": "resync"}`` instead."""
        text = dumps(message)
        self.counts.messages += 1
        seq = message.get("seq", self.seq)
        self.fan.publish(text, lambda: dumps({"type": "resync", "seq": seq}))

    def add(self) -> Subscriber[str]:
        """A new client, its queue holding the hello."""
        client: Subscriber[str] = Subscriber(queue_size=self.queue_size, needs_resync=False)
        client.queue.put_nowait(dumps(self.hello()))
        return self.fan.add(client)

    def stats(self) -> dict[str, Any]:
        """What ``/api/fleet`` shows of the websocket clients."""
        return {
            "seq": self.seq,
            "clients": len(self.fan),
            **totals(self.counts),
            "max_queued": max((c.queue.qsize() for c in self.fan), default=0),
        }


def dumps(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
