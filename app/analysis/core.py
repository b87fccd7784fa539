"""Analysis: the engine's observers of misses, evictions, what-ifs and history.

The engine owns one ``Analysis`` (settings ``analysis``), in one of two modes:

* ``inline`` (``local``): the operations call its hooks at the one moment
  each hook needs -- after the pool changed, before the engine's columns are
  re-read, so the columns still show the blocks' previous state (which hash
  a reused block lost, its queue stamp).  Every hook is O(blocks the
  operation touched), mostly in C (dict updates, numpy); what can wait runs
  at tick time (``on_tick``): the shadow batch, queue-travel statistics,
  keyframes.  Exact and synchronous; it costs the engine ~25% of its
  throughput on an eviction-heavy load (bench/bench_analysis.py).
* ``worker`` (the default, needs the recording): the engine only records;
  a live replica in the worker process runs the same hooks (``remote.py``).

Either way the recording (time travel) lives with the engine.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from app.analysis import prom, views
from app.analysis.misses import MissTracker
from app.analysis.reasons import REUSE
from app.analysis.recording import Recorder
from app.analysis.remote import RemoteAnalysis
from app.analysis.shadows import ShadowFeeder
from blockpool.shadow import ShadowSpec

if TYPE_CHECKING:
    from app.engine import Engine
    from app.schemas import AdmitOp
    from blockpool import Admission, ManagedRequest

RATE_WINDOW_S = 60.0


def shadow_specs(policies: list[str], factors: list[float], grid: bool) -> list[ShadowSpec]:
    """vLLM 0.16 at every factor, every policy at 1x (or every pair: grid)."""
    specs: list[ShadowSpec] = []
    if grid:
        for p in policies or ["vllm016"]:
            for f in sorted({1.0, *factors}):
                specs.append(ShadowSpec(p, f))
    else:
        for f in sorted({*factors, *([1.0] if "vllm016" in policies else [])}):
            specs.append(ShadowSpec("vllm016", f))
        specs.extend(ShadowSpec(p, 1.0) for p in policies if p != "vllm016")
    return list(dict.fromkeys(specs))


class Analysis:
    def __init__(self, engine: Engine, clock: Callable[[], float] = time.time) -> None:
        s = engine.settings
        self.engine = engine
        self.clock = clock  # wall time (tests inject one)
        self.groups = s.num_groups
        self.bs = s.block_size
        self.local = s.analysis_mode == "inline" or not s.recording
        self.misses = MissTracker(
            engine.pool,
            engine.columns,
            engine.hash_fn,
            s.block_size,
            s.miss_index_size if self.local else 1,
            s.miss_finished_kept,
        )
        self.rebase()
        self.feeder: ShadowFeeder | None = None
        if self.local and s.shadow_mode != "off" and s.enable_caching:
            specs = shadow_specs(list(s.shadow_policies), list(s.shadow_factors), s.shadow_grid)
            self.feeder = ShadowFeeder(
                specs,
                engine.pool.num_gpu_blocks - 1,
                s.block_size,
                s.num_groups,
                s.shadow_mode,
                s.shadow_max_lag,
            )
        self.recorder: Recorder | None = None
        if s.recording:
            self.recorder = Recorder(
                engine,
                s.recording_max_ops,
                s.recording_max_bytes,
                s.recording_keyframe_ops,
                clock=lambda: self.clock(),
            )
        self.remote: RemoteAnalysis | None = None
        if not self.local:
            assert self.recorder is not None
            self.remote = RemoteAnalysis(engine, self.recorder, s.shadow_max_lag)
        # (ts, regrets, evictions, admissions) once a tick, for rates
        self.window: deque[tuple[float, int, int, int]] = deque()
        self.tick_seconds = 0.0

    def rebase(self) -> None:
        """The free queue as the columns stamp it now is one batch (start-up,
        or a replica restored from a keyframe)."""
        cols = self.engine.columns
        free = self.engine.pool.get_num_free_blocks()
        alloc = self.engine.counters.blocks_allocated
        self.misses.batches.note_freed(
            cols.next_stamp - cols.num_blocks, free, 0, alloc, self.clock()
        )

    # ---------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.feeder is not None:
            self.feeder.start()
        if self.remote is not None:
            self.remote.start()

    def stop(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()
        if self.remote is not None:
            self.remote.stop()

    # ------------------------------------------------- answers, either mode

    async def query(self, kind: str, **args: Any) -> dict[str, Any]:
        """A view (``misses``, ``request_misses``, ``regret``, ``shadows``)."""
        if self.remote is not None:
            result = await self.remote.query(kind, **args)
            result["worker"] = self.remote.snapshot()  # how far behind the answer may be
            return result
        result = getattr(views, kind)(self, **args)
        result["worker"] = None
        return result

    def stream_section(self) -> dict[str, Any] | None:
        if self.remote is not None:
            if self.remote.stream is None:
                return None
            r = self.remote.snapshot()
            worker = {"lag_ops": r["lag_ops"], "resyncs": r["resyncs"], "error": r["error"]}
            return {**self.remote.stream, "worker": worker}
        return {**views.stream_section(self), "worker": None}

    def prom_state(self) -> dict[str, Any] | None:
        if self.remote is not None:
            return self.remote.prom
        return prom.state(self)

    def block_reasons(self, rid: str) -> list[tuple[str | None, dict[str, Any] | None]]:
        if self.remote is not None:
            packed = self.remote.reasons.get(rid)
            return views.unpack_reasons(packed) if packed is not None else []
        return views.block_reasons(self, rid)

    # ------------------------------------------------------- op hooks (hot)

    def on_admit(self, rid: str, op: AdmitOp, adm: Admission) -> None:
        e = self.engine
        managed = e.manager.requests[rid]
        now = self.clock()
        hit = adm.num_hit_blocks
        ids = adm.block_ids
        new = ids[0][hit:] if len(ids) == 1 else [b for t in ids for b in t[hit:]]
        m = self.misses
        evicted = m.ring.record_evictions(new, e.counters.blocks_allocated, REUSE, rid, now)
        m.on_admit(
            rid,
            op.token_ids,
            managed.request.all_token_ids,
            ids[0],
            op.lora_name,
            op.cache_salt,
            managed.block_hashes,
            managed.block_tables[0],
            hit,
            evicted,
            now,
        )
        if self.feeder is not None:
            self.feeder.admit(rid, len(op.token_ids), managed.block_hashes)

    def on_append(
        self,
        rid: str,
        managed: ManagedRequest,
        before_tokens: int,
        before_cached: int,
        added: list[list[int]],
    ) -> None:
        e = self.engine
        now = self.clock()
        new = added[0] if len(added) == 1 else [b for t in added for b in t]
        m = self.misses
        if new:
            m.ring.record_evictions(new, e.counters.blocks_allocated, REUSE, rid, now)
        if managed.num_cached_blocks > before_cached:
            m.on_append(
                rid,
                managed.request.all_token_ids,
                managed.block_hashes,
                managed.block_tables[0],
                before_cached,
                managed.num_cached_blocks,
                now,
            )
        if self.feeder is not None:
            self.feeder.append(rid, before_tokens, managed.num_tokens, managed.block_hashes)

    def on_finish(self, rid: str, managed: ManagedRequest, first_stamp: int) -> None:
        now = self.clock()
        self.on_freed(first_stamp, now)
        self.misses.on_finish(rid, managed.request.all_token_ids, managed.block_tables[0], now)
        if self.feeder is not None:
            self.feeder.finish(rid)

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:
        """After ``columns.stamp_freed``: the stamps from ``first_stamp`` on
        went to blocks appended at the queue's tail, in order."""
        e = self.engine
        count = e.columns.next_stamp - first_stamp
        if count > 0:
            nf_before = e.pool.get_num_free_blocks() - count
            self.misses.batches.note_freed(
                first_stamp, count, nf_before, e.counters.blocks_allocated, now or self.clock()
            )

    def on_allocate(self, ids: list[int]) -> None:
        e = self.engine
        self.misses.ring.record_evictions(
            ids, e.counters.blocks_allocated, REUSE, None, self.clock()
        )

    def on_evict(self, ids: list[int]) -> None:
        e = self.engine
        self.misses.ring.record_evict_op(ids, e.counters.blocks_allocated, self.clock())

    def on_cache(self, hashes: Sequence[bytes]) -> None:
        self.misses.on_stored(hashes, self.clock())

    def on_reset(self) -> None:
        """After the pool's reset, before the columns are re-read."""
        e = self.engine
        now = self.clock()
        self.misses.ring.record_reset(now, e.counters.blocks_allocated)
        # the columns' resync will stamp the whole queue, in order, from next_stamp
        self.misses.batches.note_freed(
            e.columns.next_stamp,
            e.pool.get_num_free_blocks(),
            0,
            e.counters.blocks_allocated,
            now,
        )
        if self.feeder is not None:
            self.feeder.reset()

    def record(self, op: Any, ok: bool, payload: Any, before: int, n_events: int) -> None:
        """``before``: events the pool had queued before this operation."""
        if self.recorder is not None:
            first = self.engine.events.last_seq + 1 + before
            self.recorder.record(op, ok, payload, first, n_events)

    # ---------------------------------------------------------- tick time

    def on_tick(self) -> None:
        t0 = time.perf_counter()
        if self.remote is not None:
            assert self.recorder is not None
            self.recorder.maybe_keyframe()
            self.remote.flush()
            self.tick_seconds += time.perf_counter() - t0
            return
        now = self.clock()
        m = self.misses
        m.process()
        if self.feeder is not None:
            st = self.engine.manager.stats
            self.feeder.flush((st.queries, st.hits))
        if self.recorder is not None:
            self.recorder.maybe_keyframe()
        w = self.window
        w.append((now, m.regret.regrets, sum(m.ring.evictions), m.admissions))
        while len(w) > 2 and w[1][0] < now - RATE_WINDOW_S:
            w.popleft()
        self.tick_seconds += time.perf_counter() - t0

    def rates(self) -> dict[str, float]:
        """Regrets and evictions per second over the last minute."""
        w = self.window
        if len(w) < 2:
            return {"regrets_per_s": 0.0, "evictions_per_s": 0.0, "window_s": 0.0}
        t0, r0, e0, _ = w[0]
        t1, r1, e1, _ = w[-1]
        dt = max(t1 - t0, 1e-9)
        return {
            "regrets_per_s": (r1 - r0) / dt,
            "evictions_per_s": (e1 - e0) / dt,
            "window_s": t1 - t0,
        }
