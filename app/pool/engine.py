"""The engine: the service's one writer of the pool.

The pool, its manager, columns, logs and counters live in the library's
``PoolRuntime`` (blockpool/runtime/), which applies operations synchronously;
the engine holds one (``runtime``) and drives it from one asyncio task.  HTTP handlers, the demo
workload and the batch endpoint hand it operations through a queue
(``submit``); one consumer task applies them in order.  Once per tick it
hands a TickData to its listeners (the stream, the ZMQ publisher) without
awaiting them, and keeps the time series of points.

The pool runs in strict mode and every operation is validated as a whole
before it changes anything (blockpool/runtime/ops/), so a refused
operation changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.analysis.host import AnalysisHost
from app.pool.gc_pacer import GcPacer
from app.pool.windowed import HitWindow
from app.shared.errors import OperationError, Unavailable
from app.shared.settings import Settings
from blockpool import KVCacheEvent, KVCacheEvictionEvent
from blockpool.runtime import PoolRuntime, RuntimeConfig
from blockpool.runtime.ops import Op

if TYPE_CHECKING:
    from blockpool.common.histogram import BucketHistogram
    from blockpool.core.hashing import HashFn
    from blockpool.core.manager import RequestManager
    from blockpool.core.metrics import KVCacheMetricsCollector
    from blockpool.core.pool import BlockPool
    from blockpool.runtime import BlockColumns, Counters, SeqLog
    from blockpool.runtime.prefix_tree import EventPrefixTree

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


def runtime_config(settings: Settings) -> RuntimeConfig:
    """The runtime's configuration from the service's settings."""
    fields = RuntimeConfig.from_mapping(settings).as_dict()
    fields["num_blocks"] = settings.effective_num_blocks
    return RuntimeConfig(**fields)


class Engine:
    def __init__(self, settings: Settings, storage: Any = None) -> None:
        rt = self.runtime = PoolRuntime(runtime_config(settings), storage)
        self.settings = settings
        self.config: RuntimeConfig = rt.config  # fixed for the runtime's life
        self.series: deque[dict[str, float]] = deque(maxlen=SERIES_CAPACITY)
        self.hit_window = HitWindow()  # hit rate 1m / 5m as Prometheus' rate() (windowed.py)
        self.waiting_sources: list[Callable[[], int]] = []  # workloads' queued requests
        # running and waiting requests (None: not known, "reason" says why); a
        # mirror's are the engine's (app/mirror/queues.py)
        self.request_counts: Callable[[], dict[str, Any]] = self._own_request_counts
        # a mirror's: the engine's requests at a past moment and between two
        # (EngineQueues.at / .between); None: the runtime's own requests say it
        self.request_history: Any = None
        # a mirror's GET /api/requests (offset, limit): the engine's running requests
        self.request_listing: Callable[[int, int], dict[str, Any]] | None = None
        # figures this service cannot know, by name -> why (a mirror's: UNKNOWN
        # in app/mirror/setup.py); the views say them null with the reason
        self.unknown: dict[str, str] = {}
        self.listeners: list[TickListener] = []
        self.started_at = time.time()
        self.tick_no = 0
        self._tick_event_seq = 0
        self._tick_sample_seq = 0
        self.events_lost_to_ticks = 0  # see TickData.events_lost
        self._last_point_counters = (time.monotonic(), 0, 0, 0, 0)
        self._queue: asyncio.Queue[Command] | None = None
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        rt.after_op = self._woken
        self.analysis = AnalysisHost(rt, settings) if settings.analysis else None
        # full garbage collections at tick time, within a budget (gc_pacer.py)
        self.gc_pacer = GcPacer()
        if self.analysis is not None:
            # the runtime tells the analysis of every change (worker mode: of
            # a jump of the pool only), and records
            rt.observe(self.analysis.observer)
            rt.recorder = self.analysis.recorder

    def _own_request_counts(self) -> dict[str, Any]:
        """Requests holding blocks, those the workloads queued, and the totals."""
        c = self.counters
        return {
            "running": len(self.manager.requests),
            "waiting": sum(f() for f in self.waiting_sources),
            "admitted": c.requests_admitted,
            "finished": c.requests_finished,
            "refused": c.requests_refused,
            "reason": None,
        }

    # ------------------------------------------------- the runtime's state

    @property
    def pool(self) -> BlockPool:
        return self.runtime.pool

    @property
    def manager(self) -> RequestManager:
        return self.runtime.manager

    @property
    def columns(self) -> BlockColumns:
        return self.runtime.columns

    @property
    def counters(self) -> Counters:
        return self.runtime.counters

    @property
    def events(self) -> SeqLog[KVCacheEvent]:
        return self.runtime.events

    @property
    def samples(self) -> SeqLog[KVCacheEvictionEvent]:
        return self.runtime.samples

    @property
    def histograms(self) -> dict[str, BucketHistogram]:
        return self.runtime.histograms

    @property
    def tree(self) -> EventPrefixTree:
        return self.runtime.tree

    @property
    def collector(self) -> KVCacheMetricsCollector:
        return self.runtime.collector

    @property
    def hash_fn(self) -> HashFn:
        return self.runtime.hash_fn

    @property
    def storage(self) -> Any:
        return self.runtime.storage

    @property
    def raw_refs(self) -> np.ndarray:
        return self.runtime.raw_refs

    @property
    def tail_waste(self) -> int:
        return self.runtime.tail_waste

    @property
    def paranoid(self) -> bool:
        return self.runtime.paranoid

    @paranoid.setter
    def paranoid(self, on: bool) -> None:
        self.runtime.paranoid = on  # check_invariants after every operation (tests)

    def check(self) -> None:
        """The pool's invariants plus the runtime's own bookkeeping."""
        self.runtime.check()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self.analysis is not None:
            self.analysis.start()
        self._queue = asyncio.Queue()
        self.gc_pacer.start()
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
        self.gc_pacer.stop()
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
                        fut.set_result(self.runtime.run(fn))
                    except OperationError as exc:
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
            self.gc_pacer.maybe_collect()

    # ----------------------------------------------------------- operations

    def _woken(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def apply(self, op: Op) -> dict[str, Any]:
        """Apply one operation now (engine context)."""
        return self.runtime.apply(op)

    def precheck(self, op: Op) -> None:
        """Limits that need no pool state (a whole batch before any op)."""
        self.runtime.precheck(op)

    async def submit_op(self, op: Op) -> dict[str, Any]:
        """Queue one operation and wait for its result."""
        rt = self.runtime
        result: dict[str, Any] = await self.submit(lambda: rt.execute(op))
        return result

    # -------------------------------------------------------------- storage

    def storage_facts(self) -> dict[str, Any] | None:
        if self.storage is None:
            return None
        counts = self.columns.counts
        facts: dict[str, Any] = self.storage.facts(counts[1], counts[2], counts[3])
        return facts

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
        reqs = self.request_counts()
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
            "requests": _or_nan(reqs["running"]),
            "waiting": _or_nan(reqs["waiting"]),
            **self.hit_window.point(stats.hits, stats.queries, c.resets),
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
            full=self.runtime.full_dirty,
            events_lost=events_lost,
            samples_lost=samples_lost,
        )
        self.runtime.full_dirty = False
        for listener in list(self.listeners):
            try:
                listener(data)
            except Exception:
                logger.exception("tick listener failed")
        return data


def _or_nan(v: int | None) -> float:
    """A series figure: NaN where it is not known (the series' JSON says null)."""
    return float("nan") if v is None else float(v)
