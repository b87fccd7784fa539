"""One observed KV-event stream (``Source``): an instance, or one data-parallel
rank of it, with its seq tracker and its rebuilt state; its sockets and their
supervised loop are ``source_sockets.py``, its health view
``source_health.py``.

The loop runs in the event loop that serves the REST and websocket views --
so the rebuilt state is only ever touched from one thread and needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.asyncio

from app.observer.source_health import source_health
from app.observer.source_sockets import SourceSockets
from app.shared.tasks import cancel_and_wait
from blockpool.kvevents.config import SourceSpec
from blockpool.kvevents.decode import MAX_BATCH_BYTES, DecodeError, decode_batch
from blockpool.kvevents.event_json import EventItem
from blockpool.kvevents.observed import ClearedEvent
from blockpool.kvevents.poison import PoisonCounter
from blockpool.kvevents.state import InstanceState
from blockpool.kvevents.tracker import SeqTracker
from blockpool.runtime.seqlog import SeqLog

logger = logging.getLogger("blockpool.observer")


class Source:
    """One stream: its sockets, its seq tracker and its rebuilt state."""

    def __init__(
        self,
        spec: SourceSpec,
        topic: str = "",
        event_log_capacity: int = 20_000,
        replay_timeout: float = 3.0,
        replay_backoff: float = 10.0,
        bootstrap_replay: bool = True,
        max_pending: int = 100_000,
        rcvhwm: int = 100_000,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        restart_backoff: tuple[float, float] = (0.1, 10.0),
        silence_s: float = 10.0,
        max_hashes: int | None = None,
        max_batch_hashes: int | None = None,
        max_batch_events: int | None = None,
        max_batch_tokens: int | None = None,
        dashboard_url: str | None = None,
    ) -> None:
        self.spec = spec
        self.dashboard_url = dashboard_url  # the engine's own dashboard (a serve --mirror)
        self.name = spec.name
        self.topic = topic.encode()
        self.replay_timeout = replay_timeout
        self.replay_backoff = replay_backoff
        self.bootstrap_replay = bootstrap_replay
        self.rcvhwm = rcvhwm
        self.max_batch_bytes = max_batch_bytes
        self.max_batch_hashes = max_batch_hashes
        self.max_batch_events = max_batch_events
        self.max_batch_tokens = max_batch_tokens
        self.restart_backoff = restart_backoff
        self.silence_s = silence_s
        self.poison = PoisonCounter(spec.name, logger)
        self.task_state = "not started"  # running / restarting / stopped / dead
        self.task_restarts = 0
        self.last_task_error: str | None = None
        self.started_at: float | None = None
        self.state = InstanceState(max_hashes)
        self.log: SeqLog[EventItem] = SeqLog(event_log_capacity)
        self.tracker = SeqTracker(
            self._apply,
            self._reset,
            has_replay=spec.replay_endpoint is not None,
            max_pending=max_pending,
        )
        self.connected = False
        self.connects = 0
        self.disconnects = 0
        self.ranks_seen: set[int] = set()
        self.encodings: dict[str, int] = {}
        self.unknown_events = 0
        self.malformed_events = 0
        self.unknown_fields: dict[str, int] = {}  # field name -> times (kept in extra)
        self.unknown_fields_total = 0
        self.bad_messages = 0
        self.replay_layouts: dict[str, int] = {}  # replay replies read, by layout
        self.refused_messages = 0  # live messages of a second publisher connection
        self.refused_publishers = 0  # such connections
        self.publisher_changes = 0  # a new connection took over from a closed one
        self.last_batch_ts: float | None = None  # the publisher's clock
        self.last_batch_at: float | None = None  # ours
        self.last_message_at: float | None = None  # ours: any live message
        self.events_total = 0
        self.resets = 0
        self.on_batch: Callable[[Source], None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sockets = SourceSockets(self)

    # ------------------------------------------------------------- applying

    def _apply(self, seq: int, payload: bytes) -> bool:
        try:
            batch = decode_batch(
                payload,
                self.max_batch_bytes,
                self.max_batch_events,
                self.max_batch_hashes,
                self.max_batch_tokens,
            )
        except DecodeError as exc:
            self.poison.add(exc.kind, f"batch {seq}: {exc}")
            raise
        now = time.time()
        if batch.issues:
            for kind, n in batch.issues.items():
                self.poison.add(kind, f"batch {seq}", n)
            if "non_finite_ts" in batch.issues:
                batch.ts = now  # the publisher's clock is unusable: ours
        if batch.unknown_fields:
            self._count_unknown_fields(batch.unknown_fields)
        if batch.malformed:
            self.tracker.lossy(f"{batch.malformed} event(s) of batch {seq} could not be read")
        overflow = self.state.overflow
        self.state.apply(batch.events, seq, batch.ts)
        if self.state.overflow != overflow:
            self.tracker.lossy(
                f"{self.state.overflow} stored block(s) not kept: over the cap of "
                f"{self.state.max_keys} held hashes (--max-hashes)"
            )
        self.encodings[batch.encoding] = self.encodings.get(batch.encoding, 0) + 1
        if batch.data_parallel_rank is not None:
            self.ranks_seen.add(batch.data_parallel_rank)
        self.unknown_events += batch.unknown
        self.malformed_events += batch.malformed
        self.last_batch_ts = batch.ts
        self.last_batch_at = now
        self.events_total += len(batch.events)
        if batch.events:
            self.log.extend(batch.ts, [(seq, ev) for ev in batch.events])
        if self.on_batch is not None:
            self.on_batch(self)
        return any(isinstance(ev, ClearedEvent) for ev in batch.events)

    def _count_unknown_fields(self, names: dict[str, int]) -> None:
        kept = self.unknown_fields
        for name, n in names.items():
            self.unknown_fields_total += n
            if name not in kept and len(kept) >= 64:
                name = "<other>"
            kept[name] = kept.get(name, 0) + n

    def _reset(self) -> None:
        self.resets += 1
        self.state.reset()

    def feed_live(self, seq: int, payload: bytes) -> int | None:
        """A live message (what the socket loop calls; tests call it too)."""
        return self.tracker.on_live(seq, payload)

    # --------------------------------------------------------------- socket

    def start(self, ctx: zmq.asyncio.Context) -> None:
        self.started_at = time.time()
        self._task = asyncio.create_task(self.sockets.supervise(ctx), name=f"observe {self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        self.task_state = "stopped"

    @property
    def task_alive(self) -> bool:
        """The task runs its socket loop (not restarting, not dead)."""
        task = self._task
        if task is not None and task.done():
            self.task_state = "dead"  # pragma: no cover - the supervisor never returns
        return self.task_state == "running"

    def wake(self) -> None:
        """Restart a failed task now rather than at the end of its backoff."""
        self.sockets.wake()

    # ---------------------------------------------------------------- views

    def last_batch_age(self, now: float) -> float:
        """Seconds since the last batch applied (since the start when none
        yet): what a stalled-publisher alert watches."""
        since = self.last_batch_at or self.started_at or now
        return max(0.0, now - since)

    def silent_for(self, now: float) -> float | None:
        """Seconds since the last live message (None: none yet)."""
        return None if self.last_message_at is None else max(0.0, now - self.last_message_at)

    def stale(self, now: float) -> bool:
        """Data came, then the publisher went away: no connection and no
        message for ``silence_s``.  The map is the last one heard and may no
        longer be the engine's.  (Connected but silent is an idle engine.)"""
        silent = self.silent_for(now)
        return silent is not None and silent >= self.silence_s and not self.connected

    def exact(self, now: float) -> bool:
        """The map is the engine's: every batch applied (``tracker.exact``)
        and the publisher has not gone away (not ``stale``)."""
        return self.tracker.exact and not self.stale(now)

    def idle(self, now: float) -> bool:
        """Data came, the publisher is still connected, and nothing for
        ``silence_s``: an engine without traffic (the map stands)."""
        silent = self.silent_for(now)
        return silent is not None and silent >= self.silence_s and self.connected

    def health(self) -> dict[str, Any]:
        """Stream health, task and map summary (``source_health.py``)."""
        return source_health(self)
