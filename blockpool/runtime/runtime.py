"""PoolRuntime: a pool, its request manager and everything kept in step with them.

The synchronous core of the service, usable on its own (a replica, replay,
trace replay, tests): one object owns the pool and the manager and applies
operations (``execute``) one at a time, each validated whole before it
changes anything; it keeps the per-block columns, the raw block references,
the counters, the prefix tree and the bounded logs of KV events and
eviction samples in step, and tells its observer (the analysis) of every
change in one documented order (blockpool/runtime/observer.py).

No asyncio, no I/O, no environment: the service's engine drives one of these
from one task (one writer).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from blockpool.common.histogram import BucketHistogram
from blockpool.core.events import BlockRemoved, BlockStored, KVCacheEvent
from blockpool.core.hashing import get_hash_fn_by_name, init_none_hash, int_block_hashes
from blockpool.core.invariants import check_invariants
from blockpool.core.manager import RequestManager
from blockpool.core.metrics import KVCacheEvictionEvent, KVCacheMetricsCollector
from blockpool.core.pool import BlockPool
from blockpool.core.snapshot import PoolSnapshot, restore_pool
from blockpool.runtime.columns import BlockColumns
from blockpool.runtime.config import Caps, RuntimeConfig
from blockpool.runtime.counters import RESIDENCY_BUCKETS, Counters
from blockpool.runtime.errors import OperationError
from blockpool.runtime.observer import Change, ChangeKind, OpObserver, notify
from blockpool.runtime.ops import READ_ONLY, Op, handle, precheck
from blockpool.runtime.prefix_tree import EventPrefixTree
from blockpool.runtime.seams import OperationRecorder, RequestStorage
from blockpool.runtime.seqlog import SeqLog

T = TypeVar("T")  # what one run of operations returns


def event_weight(ev: KVCacheEvent) -> int:
    """What an event holds: its token ids and hashes (at least 1)."""
    if ev.__class__ is BlockStored:
        return 1 + len(ev.token_ids) + len(ev.block_hashes)
    return 1 + len(getattr(ev, "block_hashes", ()))


class PoolRuntime:
    def __init__(self, config: RuntimeConfig, storage: RequestStorage | None = None) -> None:
        self.config = config
        # the limits of the operation being applied: the configuration's,
        # but for one executed with other caps (``execute``)
        self.caps: Caps = config.caps
        self.hash_fn = get_hash_fn_by_name(config.hash_fn)
        init_none_hash(self.hash_fn, seed=config.hash_seed)
        # A seeded sampling source makes runs replayable (same sampled blocks).
        seed = config.metrics_seed
        self.rng: random.Random | None = random.Random(seed) if seed is not None else None
        self.collector = KVCacheMetricsCollector(
            sample_rate=config.metrics_sample_rate,
            rng=self.rng.random if self.rng is not None else None,
        )
        self.pool = BlockPool(
            config.num_blocks,
            enable_caching=config.enable_caching,
            hash_block_size=config.block_size,
            enable_kv_cache_events=config.enable_events,
            metrics_collector=self.collector,
            strict=True,
            free_order=config.free_order,
        )
        self.manager = RequestManager(
            self.pool,
            config.block_size,
            group_ids=range(config.num_groups),
            hash_fn=self.hash_fn,
        )
        # K/V memory joined by block id (write_request(managed, start)); None: metadata only
        self.storage = storage
        self.columns = BlockColumns(self.pool)
        # References held through the raw block API (not by managed requests).
        self.raw_refs = np.zeros(self.pool.num_gpu_blocks, dtype=np.int32)
        self.events: SeqLog[KVCacheEvent] = SeqLog(
            config.event_log_capacity, config.event_log_max_tokens, event_weight
        )
        self.samples: SeqLog[KVCacheEvictionEvent] = SeqLog(config.sample_log_capacity)
        self.counters = Counters()
        self.histograms = {
            "lifetime": BucketHistogram(RESIDENCY_BUCKETS),
            "idle": BucketHistogram(RESIDENCY_BUCKETS),
            "reuse_gap": BucketHistogram(RESIDENCY_BUCKETS),
        }
        self.tree = EventPrefixTree()  # from BlockStored parents
        self.paranoid = False  # check_invariants after every operation (tests)
        self.request_counter = 0
        # Empty token slots in running requests' partial tail blocks (all groups).
        self.tail_waste = 0
        self.full_dirty = True  # every block changed since the last take (a reset)
        self.observers: tuple[OpObserver, ...] = ()  # told of every change, in order
        self.recorder: OperationRecorder | None = None  # every operation (analysis.recording)
        self.after_op: Callable[[], None] | None = None  # after each operation (a wake-up)
        self._spare: PoolRuntime | None = None  # for dry runs (trial.py)
        # the operations applied since the spare was in step (trial.py); None: not in step
        self._journal: list[Op] | None = None
        # replaying more than this costs more than a whole copy (about a few dozen blocks an op)
        self._journal_cap = max(256, self.pool.num_gpu_blocks // 8)

    # ----------------------------------------------------------- operations

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one operation, or several) now and absorb its effects."""
        self.counters.ops += 1
        try:
            return fn()
        except OperationError:
            self.counters.ops_failed += 1
            raise
        finally:
            self.absorb()
            rec = self.recorder
            if rec is not None and rec.due:
                rec.keyframe()  # between operations, everything absorbed
            if self.after_op is not None:
                self.after_op()
            if self.paranoid:
                check_invariants(self.pool)

    def apply(self, op: Op, caps: Caps | None = None) -> dict[str, Any]:
        """Apply one operation now, as a unit of its own (``caps``: see ``execute``)."""
        return self.run(lambda: self.execute(op, caps))

    def execute(self, op: Op, caps: Caps | None = None) -> dict[str, Any]:
        """Apply one operation (inside ``run``), recorded when the runtime records.

        ``caps``: the size limits it is held to; None, the configuration's
        (a client's operation); ``UNCAPPED`` for what the engine itself did
        or the writer already accepted (blockpool/runtime/config.py)."""
        rec = self.recorder
        if rec is None:
            return self._execute(op, caps)
        queue = self.pool.kv_event_queue
        start = len(queue)
        try:
            result = self._execute(op, caps)
        except OperationError as exc:
            first = self.events.last_seq + 1 + start
            rec.record(op, False, exc.as_dict(), first, len(queue) - start)
            raise
        rec.record(op, True, result, self.events.last_seq + 1 + start, len(queue) - start)
        return result

    def _execute(self, op: Op, caps: Caps | None = None) -> dict[str, Any]:
        if caps is None:
            result, change = handle(self, op)
        else:
            before = self.caps  # the configuration's (a Caps built once)
            self.caps = caps
            try:
                result, change = handle(self, op)
            finally:
                self.caps = before
        if change is not None:
            self._changed(change)
        journal = self._journal
        if journal is not None and not isinstance(op, READ_ONLY):
            journal.append(op)
            if len(journal) > self._journal_cap:
                self._journal = None  # a whole copy is cheaper than the replay now
        return result

    def _changed(self, ch: Change) -> None:
        """Steps 2-5 of blockpool/runtime/observer.py, for every operation."""
        cols = self.columns
        first_stamp = cols.next_stamp
        for blocks in ch.freed:
            cols.stamp_freed(blocks)
        for obs in self.observers:
            notify(obs, ch, first_stamp)
        if ch.kind is ChangeKind.RESET:
            self.mark_all_dirty()
        else:
            for ids in ch.sync:
                cols.sync(ids)
        self.counters.blocks_allocated += ch.allocated
        if self.storage is not None and ch.write_from is not None:
            assert ch.managed is not None
            self.storage.write_request(ch.managed, ch.write_from)

    def precheck(self, op: Op) -> None:
        """Limits that need no pool state (a whole batch before any op)."""
        precheck(self, op)

    def absorb(self) -> None:
        """Drain pool events and eviction samples into the logs and counters."""
        now = time.time()
        events = self.pool.take_events()
        if events:
            counts = self.counters.events
            tree = self.tree
            for ev in events:
                name = type(ev).__name__
                counts[name] = counts.get(name, 0) + 1
                if ev.__class__ is BlockRemoved:
                    self.counters.evictions += 1
                elif ev.__class__ is BlockStored:
                    self.counters.blocks_cached += len(ev.block_hashes)
                tree.apply(ev)
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

    def new_request_id(self) -> str:
        while True:
            self.request_counter += 1
            rid = f"req-{self.request_counter}"
            if rid not in self.manager.requests:
                return rid

    def observe(self, obs: OpObserver) -> None:
        """Tell ``obs`` of every change too, after the observers it has."""
        self.observers = (*self.observers, obs)

    # -------------------------------------------------------------- a jump

    def restore(self, snap: PoolSnapshot, parents: Mapping[bytes, bytes | None]) -> None:
        """Put the pool into another pool's state ``snap`` between operations
        (a mirror's resync from the engine's snapshot; no operation took it
        there): its blocks, queue, map and held references (``snap.refs``:
        no managed request holds any); the prefix tree rebuilt, each cached
        hash under its parent where ``parents`` (hash -> parent hash, None:
        a first block) knows it, the others its orphans; every column
        re-read; the recorder's keyframe; the observer told ``on_resync``,
        once.  Raises what ``restore_pool`` raises when it does not fit
        (nothing changed then)."""
        restore_pool(snap, self.pool, self.manager)
        self._journal = None  # a spare of this runtime's (trial.py) is out of step now
        raw = self.raw_refs
        raw[:] = 0
        for bid, ref in enumerate(snap.refs):
            if bid and ref:
                raw[bid] = ref
        self._restore_tree(snap, parents)
        self.mark_all_dirty()
        rec = self.recorder
        if rec is not None:  # time travel starts a segment here (the jump is no operation)
            rec.keyframe()
        for obs in self.observers:
            obs.on_resync()

    def _restore_tree(self, snap: PoolSnapshot, parents: Mapping[bytes, bytes | None]) -> None:
        """One copy per cached block, each hash under its parent where
        ``parents`` says it; the others are the tree's ``orphans`` (it says
        it is partial)."""
        tree = self.tree
        tree.clear()
        as_int = int_block_hashes()

        def ext(h: bytes) -> int | bytes:
            return int.from_bytes(h[-8:], "big") if as_int else h

        for i, key in enumerate(snap.map_keys):
            copies = len(snap.map_dicts.get(i, (0,)))
            h = key[:-4]  # the key without its group id
            if h in parents:
                p = parents[h]
                for _ in range(copies):
                    tree.restored(ext(h), None if p is None else ext(p), True)
            else:
                for _ in range(copies):
                    tree.restored(ext(h), None, False)

    def mark_all_dirty(self) -> None:
        self.columns.resync_all()
        self.full_dirty = True

    # ---------------------------------------------------------------- audit

    def check(self) -> None:
        """The pool's invariants plus the runtime's own bookkeeping."""
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
