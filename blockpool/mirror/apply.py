"""Applying an engine's operation stream to a PoolRuntime, exactly.

``MirrorApplier`` turns each operation of a ``Batch`` into the runtime's own
operation (allocate, free, touch, cache by hashes, evict, reset) and
executes it: every block the mirror's pool hands out must be the block the
engine's pool handed out, every refusal is a divergence, and a batch's
digest must equal the mirror's own after it.  It also puts the runtime into
a ``Snapshot``'s state (a start mid-run, a resync after a gap).

Synchronous and single-threaded: the service calls it from its one writer.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

from blockpool.core.hashing import int_block_hashes
from blockpool.core.manager import PrefixCacheStats
from blockpool.core.snapshot import PoolSnapshot, SnapshotMismatch, restore_pool
from blockpool.mirror import protocol as wire
from blockpool.mirror.poolview import pool_digest
from blockpool.runtime.errors import Conflict, OperationError
from blockpool.runtime.ops import AllocateOp, CacheOp, EvictOp, FreeOp, ResetOp, TouchOp
from blockpool.runtime.runtime import PoolRuntime


class Divergence(Conflict):
    """The mirror can no longer say it equals the engine (a resync is due)."""

    code = "mirror_divergence"


class Gap(Divergence):
    """Operations of the engine's never arrived (a drop, a lost message)."""

    code = "mirror_gap"


@dataclass
class Applied:
    ops: int  # operations applied
    digest_checked: bool


def _ids(v: Any, what: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(i, int) and i >= 0 for i in v):
        raise Divergence(f"{what}: block ids must be a list of non-negative ints")
    return v


def _hex(h: Any, what: str) -> str:
    if not isinstance(h, bytes) or not 1 <= len(h) <= 64:
        raise Divergence(f"{what}: a hash is 1..64 bytes")
    return h.hex()


class MirrorApplier:
    """Keeps one runtime equal to an engine's pool (see the module doc)."""

    def __init__(self, rt: PoolRuntime) -> None:
        self.rt = rt
        self.next_op = 0  # the index of the next operation to apply
        self.synced = False  # a snapshot (or the start) fixed next_op
        # hash -> its parent's hash (None: a first block), from the cache
        # operations applied and the requests' hash chains heard of; a
        # snapshot has no parent links, so a resync rebuilds the prefix
        # tree from these (bounded: the oldest go first)
        self.parents: dict[bytes, bytes | None] = {}
        self.parents_max = max(65_536, 4 * rt.pool.num_gpu_blocks)
        # told before an operation takes hashes out of the pool: (block ids,
        # None for every block; the cause: 0 an allocation, 1 evict, 2 reset)
        self.on_drop: Callable[[list[int] | None, int], None] | None = None

    def learn_chain(self, hashes: list[bytes], parent: bytes | None = None) -> None:
        """``hashes`` follow each other (a request's blocks, a cache operation's)."""
        known = self.parents
        for h in hashes:
            if not isinstance(h, bytes):
                return
            known.pop(h, None)  # re-inserted: the newest last
            known[h] = parent
            parent = h
        excess = len(known) - self.parents_max
        if excess > 0:
            for h in list(islice(known, excess)):
                del known[h]

    # ------------------------------------------------------------- batches

    def apply_batch(self, batch: wire.Batch) -> Applied:
        """Apply the operations of ``batch`` not applied yet (Divergence when
        the stream skipped some, or the pools disagree)."""
        if batch.first_op > self.next_op:
            raise Gap(f"operations {self.next_op}..{batch.first_op - 1} never arrived")
        skip = self.next_op - batch.first_op
        ops = batch.ops[skip:] if skip < len(batch.ops) else []
        for i, op in enumerate(ops):
            self._apply_one(op, batch.first_op + skip + i)
            self.next_op += 1
        self.set_stats(batch.stats)
        checked = False
        d = batch.digest
        if d is not None and d.ops == self.next_op:
            mine = pool_digest(self.rt.pool)
            if mine != d.value:
                raise Divergence(f"digest after {d.ops} operations differs from the engine's")
            checked = True
        return Applied(len(ops), checked)

    def set_stats(self, stats: tuple[int, int, int]) -> None:
        self.rt.manager.stats = PrefixCacheStats(*stats)

    def _run(self, op: Any, index: int) -> dict[str, Any]:
        rt = self.rt
        try:
            result: dict[str, Any] = rt.execute(op)
        except OperationError as exc:
            raise Divergence(f"operation {index} ({op.op}) refused: {exc}") from None
        return result

    def _apply_one(self, raw: Any, index: int) -> None:
        if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
            raise Divergence(f"operation {index}: not an operation")
        kind = raw[0]
        if kind == wire.OP_ALLOCATE:
            ids = _ids(raw[1] if len(raw) > 1 else None, "allocate")
            if self.on_drop is not None:
                self.on_drop(ids, 0)
            got = self._run(AllocateOp(num_blocks=len(ids)), index)["block_ids"]
            if got != ids:
                raise Divergence(
                    f"operation {index}: the engine allocated {ids[:8]}, the mirror {got[:8]}"
                )
        elif kind == wire.OP_FREE:
            ids = [i for i in _ids(raw[1] if len(raw) > 1 else None, "free") if i != 0]
            if ids:
                self._run(FreeOp(block_ids=ids), index)
        elif kind == wire.OP_TOUCH:
            ids = [i for i in _ids(raw[1] if len(raw) > 1 else None, "touch") if i != 0]
            if ids:
                self._run(TouchOp(block_ids=ids), index)
        elif kind == wire.OP_CACHE:
            if len(raw) != 5 or not isinstance(raw[1], int):
                raise Divergence(f"operation {index}: cache needs group, parent, ids, hashes")
            ids = _ids(raw[3], "cache")
            hashes = raw[4]
            if not isinstance(hashes, list) or len(hashes) != len(ids):
                raise Divergence(f"operation {index}: cache needs one hash per block")
            if ids:
                parent = None if raw[2] is None else _hex(raw[2], "cache")
                self.learn_chain(hashes, raw[2])
                self._run(
                    CacheOp(
                        block_ids=ids,
                        block_hashes=[_hex(h, "cache") for h in hashes],
                        parent_block_hash=parent,
                        group_id=raw[1],
                    ),
                    index,
                )
        elif kind == wire.OP_EVICT:
            ids = _ids(raw[1] if len(raw) > 1 else None, "evict")
            if self.on_drop is not None:
                self.on_drop(ids, 1)
            self._run(EvictOp(block_ids=ids), index)
        elif kind == wire.OP_RESET:
            if self.on_drop is not None:
                self.on_drop(None, 2)
            self._run(ResetOp(), index)
        elif kind == wire.OP_UNSUPPORTED:
            raise Divergence(f"operation {index}: the engine did {raw[1:]!r}, not mirrored")
        else:
            raise Divergence(f"operation {index}: unknown operation {kind!r}")

    # ----------------------------------------------------------- snapshots

    def restore(self, snap: wire.Snapshot) -> None:
        """Put the runtime into the snapshot's state (between operations)."""
        rt = self.rt
        n = rt.pool.num_gpu_blocks
        if len(snap.refs) != n or len(snap.keys) != n:
            raise Divergence(f"a snapshot of {len(snap.refs)} blocks for a pool of {n}")
        dicts: dict[int, tuple[int, ...]] = {}
        ids = array("q")
        for i, (_, blocks) in enumerate(snap.entries):
            if len(blocks) == 1:
                ids.append(blocks[0])
            else:
                dicts[i] = tuple(blocks)
                ids.append(blocks[0] if blocks else -1)
        ps = PoolSnapshot(
            refs=array("q", snap.refs),
            keys=list(snap.keys),
            queue=array("q", snap.queue),
            map_keys=[k for k, _ in snap.entries],
            map_ids=ids,
            map_dicts=dicts,
            stats=snap.stats,
        )
        try:
            restore_pool(ps, rt.pool, rt.manager)
        except (SnapshotMismatch, AssertionError, ValueError, KeyError) as exc:
            raise Divergence(f"the snapshot does not restore: {exc}") from None
        rt.raw_refs[:] = 0
        for bid, ref in enumerate(snap.refs):
            if bid and ref:
                rt.raw_refs[bid] = ref
        self._rebuild_tree(snap)
        rt.mark_all_dirty()
        resynced = getattr(rt.hooks, "on_resync", None)
        if resynced is not None:  # the analysis: its per-block state follows
            resynced()
        rec = rt.recorder
        if rec is not None:  # time travel starts a segment here (the jump is no operation)
            rec.keyframe()
        self.next_op = snap.ops
        self.synced = True

    def _rebuild_tree(self, snap: wire.Snapshot) -> None:
        """The prefix tree of the restored pool: one copy per cached block,
        each hash under its parent where the stream told it (``learn_chain``);
        the others are the tree's ``orphans`` (it says it is partial)."""
        tree = self.rt.tree
        tree.clear()
        as_int = int_block_hashes()

        def ext(h: bytes) -> int | bytes:
            return int.from_bytes(h[-8:], "big") if as_int else h

        known = self.parents
        for key, blocks in snap.entries:
            h = key[:-4]  # the key without its group id
            if h in known:
                p = known[h]
                for _ in blocks:
                    tree.restored(ext(h), None if p is None else ext(p), True)
            else:
                for _ in blocks:
                    tree.restored(ext(h), None, False)
