"""Analysis: observers of misses, evictions and what-ifs on a runtime.

An ``Analysis`` is the runtime's ``OpObserver`` (blockpool/runtime/observer.py):
the runtime tells it of every change at the one moment each hook needs --
after the pool changed, before the columns are re-read, so the columns
still show the blocks' previous state (which hash a reused block lost, its
queue stamp).  Every hook is O(blocks the operation touched), mostly in C
(dict updates, numpy); what can wait runs at tick time (``on_tick``): the
shadow batch, queue-travel statistics, keyframes.  Exact and synchronous.

The shadow pools are fed through a ``feeder`` (anything with ``admit``,
``append``, ``finish``, ``reset``, ``flush``, ``start``, ``stop``): inline
or in a worker process, the caller's choice.  Synchronous and offline-usable:
give it a runtime restored from a recording and replay the operations.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from blockpool.analysis.misses import MissTracker
from blockpool.common.miss_reasons import REUSE, evicted_count

if TYPE_CHECKING:
    from blockpool.core.manager import Admission, ManagedRequest
    from blockpool.runtime.runtime import PoolRuntime

RATE_WINDOW_S = 60.0


class Analysis:
    def __init__(
        self,
        rt: PoolRuntime,
        *,
        miss_index_size: int,
        miss_finished_kept: int,
        feeder: Any = None,
        recorder: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        cfg = rt.config
        self.rt = rt
        self.clock = clock  # wall time (tests, replicas inject one)
        self.groups = cfg.num_groups
        self.bs = cfg.block_size
        self.misses = MissTracker(
            rt.pool,
            rt.columns,
            rt.hash_fn,
            cfg.block_size,
            miss_index_size,
            miss_finished_kept,
        )
        self.rebase()
        self.feeder = feeder
        self.recorder = recorder  # shown in the stream section; kept by the caller
        # (ts, regrets, evictions, admissions) once a tick, for rates
        self.window: deque[tuple[float, int, int, int]] = deque()
        self.tick_seconds = 0.0

    def rebase(self) -> None:
        """The free queue as the columns stamp it now is one batch (start-up,
        or a replica restored from a keyframe)."""
        cols = self.rt.columns
        free = self.rt.pool.get_num_free_blocks()
        alloc = self.rt.counters.blocks_allocated
        self.misses.batches.note_freed(
            cols.next_stamp - cols.num_blocks, free, 0, alloc, self.clock()
        )

    # ---------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.feeder is not None:
            self.feeder.start()

    def stop(self) -> None:
        if self.feeder is not None:
            self.feeder.stop()

    # ------------------------------------------------------- op hooks (hot)

    def on_admit(self, rid: str, op: Any, adm: Admission) -> None:
        e = self.rt
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
        e = self.rt
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
        e = self.rt
        count = e.columns.next_stamp - first_stamp
        if count > 0:
            nf_before = e.pool.get_num_free_blocks() - count
            self.misses.batches.note_freed(
                first_stamp, count, nf_before, e.counters.blocks_allocated, now or self.clock()
            )

    def on_allocate(self, ids: list[int]) -> None:
        e = self.rt
        self.misses.ring.record_evictions(
            ids, e.counters.blocks_allocated, REUSE, None, self.clock()
        )

    def on_evict(self, ids: list[int]) -> None:
        e = self.rt
        self.misses.ring.record_evict_op(ids, e.counters.blocks_allocated, self.clock())

    def on_cache(self, hashes: Sequence[bytes]) -> None:
        self.misses.on_stored(hashes, self.clock())

    def on_reset(self) -> None:
        """After the pool's reset, before the columns are re-read."""
        e = self.rt
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
            # the shadows start over with the pool: empty, counters "since
            # the reset", compared with the real pool's counters since then
            st = self.rt.manager.stats
            real = (st.queries, st.hits)
            self.feeder.flush(real)
            self.feeder.restart(real)

    def on_resync(self) -> None:
        """After the pool was put into another pool's state (a mirror's
        snapshot), with the columns already re-read: the free queue is one
        new batch, and an eviction remembered of a hash cached again now is
        forgotten (it came back unseen: a later store or miss of it is no
        regret of that eviction)."""
        self.rebase()
        ring = self.misses.ring
        cols = self.rt.columns
        cached = set(cols.hash64[np.flatnonzero(cols.hashed)].tolist())
        if cached and ring.evicted:
            ring.evicted = {h: s for h, s in ring.evicted.items() if h not in cached}

    # ---------------------------------------------------------- tick time

    def on_tick(self) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        m = self.misses
        m.process()
        if self.feeder is not None:
            st = self.rt.manager.stats
            self.feeder.flush((st.queries, st.hits))
        w = self.window
        w.append((now, m.regret.regrets, evicted_count(m.ring.evictions), m.admissions))
        while len(w) > 2 and w[1][0] < now - RATE_WINDOW_S:
            w.popleft()
        self.tick_seconds += time.perf_counter() - t0

    def rates(self) -> dict[str, float]:
        """Regrets and evictions per second over the last minute (a reset's
        drops are not evictions)."""
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
