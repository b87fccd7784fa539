"""The engine: the one object that owns and mutates the pool.

HTTP handlers, the demo workload and the batch endpoint hand it operations
through an asyncio queue (``submit``); one consumer task applies them in
order.  After every operation the engine drains the pool's KV events and the
collector's eviction samples into sequenced logs, and re-reads the blocks the
operation touched into its columns.  Once per tick it hands a TickData to its
listeners (the stream, the ZMQ publisher) without awaiting them.

The pool runs in strict mode and every operation is validated as a whole
before it changes anything (see ops.py), so a refused operation changes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from app import ops
from app.analysis.core import Analysis
from app.columns import BlockColumns
from app.counters import RESIDENCY_BUCKETS, Counters, Histogram
from app.errors import ApiError, Unavailable
from app.event_log import SeqLog
from app.settings import Settings
from blockpool import (
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVCacheEvictionEvent,
    KVCacheMetricsCollector,
    RequestManager,
    check_invariants,
    get_hash_fn_by_name,
    init_none_hash,
)

logger = logging.getLogger("blockpool.engine")

SERIES_CAPACITY = 6000
IDLE_TICK_S = 0.5  # ticks while nothing changes (series points, liveness)


@dataclass
class TickData:
    """What changed since the previous tick."""

    tick: int
    ts: float
    dirty: np.ndarray
    events: list[tuple[int, float, KVCacheEvent]]
    samples: list[tuple[int, float, KVCacheEvictionEvent]]
    point: dict[str, float]
    full: bool  # every block changed (reset): clients may prefer a snapshot
    # events / samples of this tick already pushed out of their bounded logs
    # before the tick saw them (one huge operation): listeners count them
    events_lost: int = 0
    samples_lost: int = 0


TickListener = Callable[[TickData], None]
Command = tuple[Callable[[], Any], "asyncio.Future[Any]"]


class Engine:
    def __init__(self, settings: Settings, storage: Any = None) -> None:
        self.settings = settings
        self.hash_fn = get_hash_fn_by_name(settings.hash_fn)
        init_none_hash(self.hash_fn, seed=settings.hash_seed)
        # A seeded sampling source makes runs replayable (same sampled blocks).
        seed = settings.metrics_seed
        self.rng: random.Random | None = random.Random(seed) if seed is not None else None
        self.collector = KVCacheMetricsCollector(
            sample_rate=settings.metrics_sample_rate,
            rng=self.rng.random if self.rng is not None else None,
        )
        self.pool = BlockPool(
            settings.effective_num_blocks,
            enable_caching=settings.enable_caching,
            hash_block_size=settings.block_size,
            enable_kv_cache_events=settings.enable_events,
            metrics_collector=self.collector,
            strict=True,
            free_order=settings.free_order,
        )
        self.manager = RequestManager(
            self.pool,
            settings.block_size,
            group_ids=range(settings.num_groups),
            hash_fn=self.hash_fn,
        )
        self.storage = storage
        self.columns = BlockColumns(self.pool)
        # References held through the raw block API (not by managed requests).
        self.raw_refs = np.zeros(self.pool.num_gpu_blocks, dtype=np.int32)
        self.events: SeqLog[KVCacheEvent] = SeqLog(settings.event_log_capacity)
        self.samples: SeqLog[KVCacheEvictionEvent] = SeqLog(settings.sample_log_capacity)
        self.counters = Counters()
        self.histograms = {
            "lifetime": Histogram(RESIDENCY_BUCKETS),
            "idle": Histogram(RESIDENCY_BUCKETS),
            "reuse_gap": Histogram(RESIDENCY_BUCKETS),
        }
        self.series: deque[dict[str, float]] = deque(maxlen=SERIES_CAPACITY)
        self.listeners: list[TickListener] = []
        # The prefix tree from BlockStored parents: hash -> (parent, copies).
        self.parents: dict[int | bytes, int | bytes | None] = {}
        self.copies: dict[int | bytes, int] = {}
        self.started_at = time.time()
        self.paranoid = False  # check_invariants after every operation (tests)
        self.tick_no = 0
        self._tick_event_seq = 0
        self._tick_sample_seq = 0
        self.events_lost_to_ticks = 0  # see TickData.events_lost
        self._full_dirty = True
        self._last_point_counters = (time.monotonic(), 0, 0, 0, 0)
        self._queue: asyncio.Queue[Command] | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._next_request = 0
        # Empty token slots in running requests' partial tail blocks (all groups).
        self.tail_waste = 0
        self.analysis: Analysis | None = Analysis(self) if settings.analysis else None
        # the analysis the operations call into (inline mode only)
        self.hooks = self.analysis if self.analysis is not None and self.analysis.local else None

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.analysis is not None:
            self.analysis.start()
        self._queue = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._consume(), name="engine-commands"),
            asyncio.create_task(self._ticker(), name="engine-ticks"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            while not task.done():
                # A cancellation swallowed by a race is asked for again.
                done, _ = await asyncio.wait({task}, timeout=1.0)
                if not done:
                    task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._queue is not None:
            while not self._queue.empty():
                _, fut = self._queue.get_nowait()
                if not fut.done():
                    fut.set_exception(Unavailable("the engine is shutting down"))
        self._queue = None
        if self.analysis is not None:
            self.analysis.stop()

    async def submit(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (an operation closure) on the engine, in order."""
        if self._queue is None:
            raise Unavailable("the engine is not running")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((fn, fut))
        return await fut

    async def _consume(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            fn, fut = await queue.get()
            while True:
                if not fut.cancelled():
                    try:
                        fut.set_result(self.run_op(fn))
                    except ApiError as exc:
                        fut.set_exception(exc)
                    except Exception as exc:  # a bug: report it, keep serving
                        logger.exception("operation failed unexpectedly")
                        fut.set_exception(exc)
                if queue.empty():
                    break
                fn, fut = queue.get_nowait()

    async def _ticker(self) -> None:
        """Ticks at most every 1/tick_hz; an operation after a quiet spell is
        ticked at once (low latency), and an idle pool still ticks every
        IDLE_TICK_S so that charts and clients see it alive."""
        period = 1.0 / self.settings.tick_hz
        wake = self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            now = loop.time()
            if not wake.is_set():
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with the event being set.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, last + IDLE_TICK_S - now)):
                        await wake.wait()
            now = loop.time()
            if now < last + period:
                await asyncio.sleep(last + period - now)
            wake.clear()
            last = loop.time()
            try:
                self.tick()
            except Exception:
                logger.exception("tick failed")

    # ----------------------------------------------------------- operations

    def run_op(self, fn: Callable[[], Any]) -> Any:
        """Apply one operation now (engine context only) and absorb its effects."""
        self.counters.ops += 1
        try:
            return fn()
        except ApiError:
            self.counters.ops_failed += 1
            raise
        finally:
            self.absorb()
            an = self.analysis
            if an is not None and an.recorder is not None and an.recorder.due:
                an.recorder.keyframe()  # between operations, everything absorbed
            if self._wake is not None:
                self._wake.set()
            if self.paranoid:
                check_invariants(self.pool)

    def apply(self, op: Any) -> dict[str, Any]:
        """Apply one operation model now (engine context)."""
        return self.run_op(partial(self._execute, op))  # type: ignore[no-any-return]

    async def submit_op(self, op: Any) -> dict[str, Any]:
        """Queue one operation model and wait for its result."""
        result: dict[str, Any] = await self.submit(partial(self._execute, op))
        return result

    def _execute(self, op: Any) -> dict[str, Any]:
        """ops.execute, recorded (op, result or error, its events) when the
        analysis records."""
        an = self.analysis
        if an is None or an.recorder is None:
            return ops.execute(self, op)
        queue = self.pool.kv_event_queue
        start = len(queue)
        try:
            result = ops.execute(self, op)
        except ApiError as exc:
            an.record(op, False, exc.body()["error"], start, len(queue) - start)
            raise
        an.record(op, True, result, start, len(queue) - start)
        return result

    def absorb(self) -> None:
        """Drain pool events and eviction samples into the logs and counters."""
        now = time.time()
        events = self.pool.take_events()
        if events:
            counts = self.counters.events
            for ev in events:
                name = type(ev).__name__
                counts[name] = counts.get(name, 0) + 1
                if ev.__class__ is BlockRemoved:
                    self.counters.evictions += 1
                elif ev.__class__ is BlockStored:
                    self.counters.blocks_cached += len(ev.block_hashes)
                self._track_tree(ev)
            self.events.extend(now, events)
        samples = self.collector.drain_events()
        if samples:
            h = self.histograms
            for s in samples:
                h["lifetime"].observe(s.lifetime_seconds)
                h["idle"].observe(s.idle_seconds)
                for gap in s.reuse_gaps_seconds:
                    h["reuse_gap"].observe(gap)
            self.samples.extend(now, samples)

    # -------------------------------------------------------------- storage

    def storage_write(self, request_id: str, start_token: int) -> None:
        """Write K/V for the request's tokens from ``start_token`` on (the
        tokens this operation computed) into its blocks."""
        if self.storage is None:
            return
        managed = self.manager.requests[request_id]
        self.storage.write_request(managed, start_token)

    def storage_facts(self) -> dict[str, Any] | None:
        if self.storage is None:
            return None
        counts = self.columns.counts
        facts: dict[str, Any] = self.storage.facts(counts[1], counts[2], counts[3])
        return facts

    def _track_tree(self, ev: KVCacheEvent) -> None:
        parents, copies = self.parents, self.copies
        if isinstance(ev, BlockStored):
            parent = ev.parent_block_hash
            for h in ev.block_hashes:
                parents[h] = parent
                copies[h] = copies.get(h, 0) + 1
                parent = h
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                n = copies.get(h, 0) - 1
                if n > 0:
                    copies[h] = n
                else:
                    copies.pop(h, None)
                    parents.pop(h, None)
        else:
            parents.clear()
            copies.clear()

    def new_request_id(self) -> str:
        while True:
            self._next_request += 1
            rid = f"req-{self._next_request}"
            if rid not in self.manager.requests:
                return rid

    # ---------------------------------------------------------------- ticks

    def point(self) -> dict[str, float]:
        """One time-series point: block states, usage, rates since the last."""
        now = time.monotonic()
        c = self.counters
        stats = self.manager.stats
        t0, alloc0, evict0, q0, h0 = self._last_point_counters
        dt = max(now - t0, 1e-9)
        dq = stats.queries - q0
        counts = self.columns.counts
        point = {
            "ts": time.time(),
            "in_use": float(counts[1]),
            "cached": float(counts[2]),
            "empty": float(counts[3]),
            "usage": float(self.pool.get_usage()),
            "hit_rate": (stats.hits - h0) / dq if dq else float("nan"),
            "hit_rate_total": stats.hit_rate,
            "alloc_per_s": (c.blocks_allocated - alloc0) / dt,
            "evict_per_s": (c.evictions - evict0) / dt,
            "requests": float(len(self.manager.requests)),
        }
        self._last_point_counters = (
            now,
            c.blocks_allocated,
            c.evictions,
            stats.queries,
            stats.hits,
        )
        return point

    def tick(self) -> TickData:
        """Collect what changed since the last tick and hand it to listeners."""
        self.tick_no += 1
        if self.analysis is not None:
            try:
                self.analysis.on_tick()
            except Exception:
                logger.exception("analysis tick failed")
        point = self.point()
        self.series.append(point)
        events, ev_cut = self.events.since(self._tick_event_seq, 1 << 30)
        samples, sm_cut = self.samples.since(self._tick_sample_seq, 1 << 30)
        events_lost = self.events.first_seq - self._tick_event_seq - 1 if ev_cut else 0
        samples_lost = self.samples.first_seq - self._tick_sample_seq - 1 if sm_cut else 0
        self.events_lost_to_ticks += events_lost
        self._tick_event_seq = self.events.last_seq
        self._tick_sample_seq = self.samples.last_seq
        data = TickData(
            tick=self.tick_no,
            ts=point["ts"],
            dirty=self.columns.take_dirty(),
            events=events,
            samples=samples,
            point=point,
            full=self._full_dirty,
            events_lost=events_lost,
            samples_lost=samples_lost,
        )
        self._full_dirty = False
        for listener in list(self.listeners):
            try:
                listener(data)
            except Exception:
                logger.exception("tick listener failed")
        return data

    def mark_all_dirty(self) -> None:
        self.columns.resync_all()
        self._full_dirty = True

    def check(self) -> None:
        """The pool's invariants plus the engine's own bookkeeping."""
        check_invariants(self.pool)
        cols = self.columns
        pool = self.pool
        for bid, block in enumerate(pool.blocks):
            if bid == 0:
                continue
            assert cols.ref_cnt[bid] == block.ref_cnt, f"column ref_cnt of block {bid}"
            assert bool(cols.hashed[bid]) == (block.block_hash is not None), f"hashed {bid}"
        order = [b.block_id for b in pool.free_block_queue]
        assert cols.queue_order().tolist() == order, "stamps disagree with the free queue"
        held_by_requests = np.zeros(pool.num_gpu_blocks, dtype=np.int64)
        for managed in self.manager.requests.values():
            for table in managed.block_tables:
                for b in table:
                    held_by_requests[b.block_id] += 1
        refs = np.array([b.ref_cnt for b in pool.blocks], dtype=np.int64)
        refs[0] = 0
        assert np.array_equal(refs, held_by_requests + self.raw_refs), "ref counts vs holders"
