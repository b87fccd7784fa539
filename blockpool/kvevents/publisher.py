"""Publish the engine's KV events over ZMQ, as vLLM 0.16's ZmqEventPublisher.

The wire, as vLLM's subscribers read it:

* a PUB socket on ``endpoint`` sends one message per engine tick that had
  events: the frames ``topic``, the sequence number (8 bytes, big-endian,
  from 0) and the msgpack of ``KVEventBatch(ts, events, data_parallel_rank)``
  in vLLM 0.16's positional form (``blockpool.encode_event_batch``), or with
  ``events_format="map"`` the current vLLM's map-tagged events
  (``wire_format.py``);
* an optional ROUTER socket on ``replay_endpoint`` answers a request
  ``[identity, b"", start_seq (8 bytes)]`` with every buffered batch whose
  seq >= start as ``[identity, b"", seq, payload]``, then
  ``[identity, b"", END_SEQ (-1), b""]`` -- with ``events_format="map"``
  as the current vLLM answers: ``[identity, b"", topic, seq, payload]``,
  then ``[identity, b"", b"", END_SEQ, b""]`` (``replay_router.py``).

What differs from vLLM, and why:

* The engine never waits on ZMQ.  ``on_tick`` (the engine's tick listener)
  only puts the tick's events on a bounded queue; when the queue is full the
  batch is dropped and counted (vLLM blocks the scheduler instead).  A batch
  takes its sequence number when it is queued, so a dropped batch leaves a
  gap in the sequence that every subscriber sees: nothing is lost silently.
* Replays are served a slice at a time between publishes (the ROUTER never
  blocks the PUB), with the ROUTER's high-water mark raised to ``hwm``; a
  replay to a peer that went away is abandoned and counted.
* The PUB binds wildcard/ipc/inproc addresses and connects to others, like
  vLLM; ``bind="bind"`` binds a concrete address too.  Which of the two it
  does is logged at start and shown in ``status()`` (``mode``): a loopback
  endpoint under ``auto`` connects, so a subscriber must bind there.

The sockets are opened in ``sockets.py``, replays served by
``replay_router.py``, the counters in ``publisher_counts.py``.

One thread owns both sockets and a private ``zmq.Context`` (sockets are not
thread-safe); ``stop()`` sends what is queued (up to ``shutdown_timeout``),
closes the sockets with linger 0 and terminates the context.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import zmq

from blockpool.common.figures import rest_view, totals
from blockpool.core.events import KVCacheEvent, KVEventBatch, encode_event_batch
from blockpool.kvevents.config import KVEventsConfig
from blockpool.kvevents.publisher_counts import PublisherCounts
from blockpool.kvevents.replay_router import ReplayRouter
from blockpool.kvevents.sockets import open_sockets
from blockpool.kvevents.wire_format import encode_map_batch


class TickSource(Protocol):
    """What the publisher follows: a runtime with tick listeners (the
    service's engine); each tick has ``ts``, ``events`` as (seq, ts, event)
    and ``events_lost``."""

    config: Any
    listeners: list[Any]


logger = logging.getLogger("blockpool.kvevents")

_Item = tuple[int, float, list[KVCacheEvent]]


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig, shutdown_timeout: float = 1.0) -> None:
        self.config = config
        self.shutdown_timeout = shutdown_timeout
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self._rank = config.data_parallel_rank
        self._next_seq = 0
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._running = False
        self._engine: TickSource | None = None
        # the map form's group_idx: known only for a one-group engine
        self._group_idx: int | None = None
        self.bound_endpoint: str | None = None
        self.bound_replay_endpoint: str | None = None
        self.counts = PublisherCounts()  # engine side: queued/dropped; thread: the rest
        self.last_published_seq = -1

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 10.0) -> None:
        """Open the sockets (raises when a bind fails) and start the thread."""
        if self._thread is not None:
            raise RuntimeError("the publisher is already started")
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the KV-event publisher did not start")
        if self._startup_error is not None:
            self._thread.join(timeout)
            self._thread = None
            self._running = False
            err = self._startup_error
            raise RuntimeError(f"KV-event publisher: {err}") from err
        cfg = self.config
        replay = self.bound_replay_endpoint
        logger.info(
            "KV events: PUB %s %s (--kv-events-bind %s%s), %s events%s",
            cfg.mode,
            self.bound_endpoint,
            cfg.bind,
            "" if cfg.binds() else ": a subscriber must bind this address",
            cfg.events_format,
            f"; replay ROUTER bind {replay}" if replay else "",
        )

    def stop(self) -> None:
        """Send what is queued (bounded by shutdown_timeout), then close."""
        self.detach()
        thread = self._thread
        if thread is None:
            return
        self._running = False
        # when the queue is full the thread sees _running and stops after draining
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        thread.join(self.shutdown_timeout + 5.0)
        if thread.is_alive():  # pragma: no cover - a stuck libzmq call
            logger.error("the KV-event publisher thread did not stop")
        self._thread = None

    def attach(self, engine: TickSource) -> None:
        """Publish every tick of ``engine`` that has events."""
        self._engine = engine
        self._group_idx = 0 if engine.config.num_groups == 1 else None
        if self.on_tick not in engine.listeners:
            engine.listeners.append(self.on_tick)

    def detach(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and self.on_tick in engine.listeners:
            engine.listeners.remove(self.on_tick)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._running

    # ---------------------------------------------------------- engine side

    def on_tick(self, data: Any) -> None:
        """The engine's tick listener: queue the tick's events, never wait."""
        if not self._running:
            return
        if data.events_lost:
            # the oldest of the tick's events were already gone from the
            # engine's log: their batch is a sequence gap, as a dropped one
            self.skip_batch(data.events_lost)
        if data.events:
            self.publish_events(data.ts, [ev for _, _, ev in data.events])

    def skip_batch(self, num_events: int) -> int:
        """Leave one sequence number unpublished for ``num_events`` events
        that cannot be sent; counted as a dropped batch.  Returns the seq."""
        seq = self._next_seq
        self._next_seq += 1
        self.counts.batches_dropped += 1
        self.counts.events_dropped += num_events
        return seq

    def publish_events(self, ts: float, events: Sequence[KVCacheEvent]) -> int | None:
        """Queue one batch; returns its sequence number, or None when the
        queue was full (the batch is dropped, its seq left as a gap)."""
        if not self._running:
            raise RuntimeError("the KV-event publisher is not running")
        seq = self._next_seq
        self._next_seq += 1
        try:
            self._queue.put_nowait((seq, ts, list(events)))
        except queue.Full:
            self.counts.batches_dropped += 1
            self.counts.events_dropped += len(events)
            return None
        self.counts.batches_queued += 1
        return seq

    # --------------------------------------------------------------- thread

    def _run(self) -> None:
        ctx: zmq.Context[Any] = zmq.Context()
        try:
            try:
                sockets = open_sockets(ctx, self.config)
            except BaseException as exc:  # reported by start()
                self._startup_error = exc
                self._ready.set()
                return
            pub, router = sockets.pub, sockets.router
            self.bound_endpoint = sockets.bound_endpoint
            self.bound_replay_endpoint = sockets.bound_replay_endpoint
            self._ready.set()
            try:
                self._loop(pub, router)
            finally:
                pub.close(linger=0)
                if router is not None:
                    router.close(linger=0)
        finally:
            ctx.term()

    def _loop(self, pub: zmq.Socket[Any], router: zmq.Socket[Any] | None) -> None:
        current = self.config.events_format == "map"  # replies laid out as vLLM >= 0.24's
        replays = ReplayRouter(self._buffer, self.counts, self._topic if current else None)
        jobs = replays.jobs
        deadline: float | None = None
        while True:
            if not self._running and deadline is None:
                deadline = time.monotonic() + self.shutdown_timeout
            if deadline is not None and time.monotonic() > deadline:
                left = self._queue.qsize()
                if left:
                    logger.warning("KV-event publisher: %d batch(es) unsent at shutdown", left)
                return
            # replay requests and replies (non-critical, never blocking)
            if router is not None:
                replays.take_requests(router)
                if jobs:
                    replays.serve(router)
            # the queue (critical): everything queued, then wait a little
            wait = 0.0 if jobs else 0.05
            try:
                item = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                if not self._running:
                    return
                if jobs:
                    time.sleep(0.001)
                continue
            while True:
                if item is None:
                    if self._queue.empty():
                        return
                else:
                    self._send(pub, item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break

    def _send(self, pub: zmq.Socket[Any], item: _Item) -> None:
        seq, ts, events = item
        try:
            if self.config.events_format == "map":
                payload = encode_map_batch(ts, events, self._rank, self._group_idx)
            else:
                payload = encode_event_batch(
                    KVEventBatch(ts=ts, events=events, data_parallel_rank=self._rank)  # type: ignore[arg-type]
                )
            pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        except zmq.Again:
            self.counts.batches_dropped += 1
            self.counts.events_dropped += len(events)
            return
        except Exception:
            self.counts.send_errors += 1
            logger.exception("KV-event publisher: sending seq %d failed", seq)
            return
        if len(self._buffer) == self._buffer.maxlen:
            self.counts.buffer_evicted += 1
        self._buffer.append((seq, payload))
        self.counts.batches_published += 1
        self.counts.events_published += len(events)
        self.counts.bytes_published += len(payload)
        self.last_published_seq = seq

    # -------------------------------------------------------------- reading

    def metrics(self) -> dict[str, float]:
        """Counters and gauges for /metrics (``_total`` = counter; HELP in
        ``PUBLISHER_HELP``)."""
        return {
            **{k: float(v) for k, v in totals(self.counts).items()},
            "queue_batches": float(self._queue.qsize()),
            "queue_capacity_batches": float(self.config.max_queue_size),
            "buffer_batches": float(len(self._buffer)),
            "buffer_capacity_batches": float(self.config.buffer_steps),
            "last_seq": float(self.last_published_seq),
            "running": 1.0 if self.running else 0.0,
        }

    def status(self) -> dict[str, Any]:
        """What /api/kv-events shows."""
        cfg = self.config
        first = self._buffer[0][0] if self._buffer else None
        return {
            "enabled": True,
            "running": self.running,
            "endpoint": cfg.pub_endpoint,
            "bound_endpoint": self.bound_endpoint,
            "binds": cfg.binds(),
            "mode": cfg.mode,
            "bind_setting": cfg.bind,
            "events_format": cfg.events_format,
            "replay_endpoint": cfg.router_endpoint,
            "bound_replay_endpoint": self.bound_replay_endpoint,
            "topic": cfg.topic,
            "data_parallel_rank": cfg.data_parallel_rank,
            "buffer_steps": cfg.buffer_steps,
            "hwm": cfg.hwm,
            "max_queue_size": cfg.max_queue_size,
            "next_seq": self._next_seq,
            "last_seq": self.last_published_seq,
            "buffer_first_seq": first,
            "buffer_batches": len(self._buffer),
            "queue_batches": self._queue.qsize(),
            **rest_view(self.counts),
        }
