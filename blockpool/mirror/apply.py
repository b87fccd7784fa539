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

from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice
from typing import Any

from blockpool.core.manager import PrefixCacheStats
from blockpool.core.snapshot import SnapshotMismatch
from blockpool.mirror import protocol as wire
from blockpool.mirror.digest import PoolDigest
from blockpool.mirror.poolview import BadSnapshot, to_pool_snapshot
from blockpool.runtime.config import UNCAPPED
from blockpool.runtime.errors import Conflict, OperationError
from blockpool.runtime.ops import (
    AllocateOp,
    EngineCacheOp,
    EvictOp,
    FreeOp,
    Op,
    ResetOp,
    TouchOp,
)
from blockpool.runtime.runtime import PoolRuntime

BOUNDARIES_KEPT = 4096  # batch boundaries whose digest the mirror keeps


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


class MirrorApplier:
    """Keeps one runtime equal to an engine's pool (see the module doc)."""

    def __init__(self, rt: PoolRuntime) -> None:
        self.rt = rt
        self.digest = PoolDigest(rt.pool)  # the mirror's own, kept as operations apply
        # its digest at the last batch boundaries (operations -> digest): the
        # engine takes its own off its thread and sends it a batch or two later
        self.boundaries: OrderedDict[int, str] = OrderedDict()
        self.next_op = 0  # the index of the next operation to apply
        self.synced = False  # a snapshot (or the start) fixed next_op
        # hash -> its parent's hash (None: a first block), from the cache
        # operations applied and the requests' hash chains heard of; a
        # snapshot has no parent links, so a resync rebuilds the prefix
        # tree from these (bounded: the oldest go first)
        self.parents: dict[bytes, bytes | None] = {}
        self.parents_max = max(65_536, 4 * rt.pool.num_gpu_blocks)

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

    def learn_requests(self, records: list[wire.Record]) -> None:
        """The hash chains of the requests that arrived (the writer runs it
        for every batch, synced or not: a resync's tree needs them)."""
        for rec in records:
            if isinstance(rec, wire.Arrive):
                self.learn_chain(rec.hashes[:4096])

    # ------------------------------------------------------------- batches

    def apply_batch(self, batch: wire.Batch) -> Applied:
        """Apply the operations of ``batch`` not applied yet (Divergence when
        the stream skipped some, or the pools disagree)."""
        if batch.first_op > self.next_op:
            raise Gap(f"operations {self.next_op}..{batch.first_op - 1} never arrived")
        skip = self.next_op - batch.first_op
        ops = batch.ops[skip:] if skip < len(batch.ops) else []
        touched: list[int] = []
        try:
            for i, op in enumerate(ops):
                self._apply_one(op, batch.first_op + skip + i, touched)
                self.next_op += 1
        finally:
            self._follow(touched)
        self.set_stats(batch.stats)
        self._boundary()
        d = batch.digest
        return Applied(len(ops), d is not None and self.check_digest(d))

    def _boundary(self) -> None:
        """The digest at this batch boundary, kept a while."""
        b = self.boundaries
        b[self.next_op] = self.digest.value
        b.move_to_end(self.next_op)
        while len(b) > BOUNDARIES_KEPT:
            b.popitem(last=False)

    def check_digest(self, d: wire.Digest) -> bool:
        """The engine's digest after ``d.ops`` operations against the mirror's
        own then (Divergence when they differ); False when the mirror has no
        digest of that boundary (one before its last sync, or too old)."""
        mine = self.boundaries.get(d.ops)
        if mine is None:
            return False
        if mine != d.value:
            raise Divergence(f"digest after {d.ops} operations differs from the engine's")
        return True

    def set_stats(self, stats: tuple[int, int, int]) -> None:
        self.rt.manager.stats = PrefixCacheStats(*stats)

    def _run(self, op: Op, index: int) -> dict[str, Any]:
        rt = self.rt
        try:
            # the engine's own step: no client's caps (ids per call...), the
            # wire's decode bounded its ids and the handlers check ranges
            result: dict[str, Any] = rt.execute(op, UNCAPPED)
        except OperationError as exc:
            raise Divergence(f"operation {index} ({op.op}) refused: {exc}") from None
        return result

    def _follow(self, touched: list[int]) -> None:
        """The digest after the operations that named ``touched`` (-1: a reset)."""
        if -1 in touched:
            self.digest.update([i for i in touched if i > 0])
            self.digest.after_reset()  # (after: update reads the old links)
        elif touched:
            self.digest.update(touched)

    def _apply_one(self, op: wire.Op, index: int, touched: list[int]) -> None:
        if isinstance(op, wire.Allocate):
            ids = op.ids
            touched.extend(ids)
            got = self._run(AllocateOp(num_blocks=len(ids)), index)["block_ids"]
            if got != ids:
                raise Divergence(
                    f"operation {index}: the engine allocated {ids[:8]}, the mirror {got[:8]}"
                )
        elif isinstance(op, (wire.Free, wire.Touch)):
            ids = [i for i in op.ids if i != 0]
            touched.extend(ids)
            if ids:
                kind = FreeOp if isinstance(op, wire.Free) else TouchOp
                self._run(kind(block_ids=ids), index)
        elif isinstance(op, wire.Cache):
            ids, hashes = op.ids, op.hashes
            if len(hashes) != len(ids):
                raise Divergence(f"operation {index}: cache needs one hash per block")
            touched.extend(ids)
            if ids:
                self.learn_chain(hashes, op.parent)
                # the engine's hashes as they came (bytes: hexed only where
                # they leave, the API's and a recording's export)
                self._run(
                    EngineCacheOp(
                        block_ids=ids,
                        block_hashes=hashes,
                        parent_block_hash=op.parent,
                        group_id=op.group,
                    ),
                    index,
                )
        elif isinstance(op, wire.Evict):
            touched.extend(op.ids)
            self._run(EvictOp(block_ids=op.ids), index)
        elif isinstance(op, wire.Reset):
            touched.append(-1)
            self._run(ResetOp(), index)
        elif isinstance(op, wire.Unsupported):
            raise Divergence(f"operation {index}: the engine did {op.what!r}, not mirrored")
        else:  # pragma: no cover - decode admits only the operations above
            raise Divergence(f"operation {index}: unknown operation {op!r}")

    # ----------------------------------------------------------- snapshots

    def restore(self, snap: wire.Snapshot) -> None:
        """Put the runtime into the snapshot's state (between operations)."""
        rt = self.rt
        n = len(rt.pool.blocks)
        if snap.num_blocks != n:
            raise Divergence(f"a snapshot of {snap.num_blocks} blocks for a pool of {n}")
        try:
            ps, digest = to_pool_snapshot(snap)
        except BadSnapshot as exc:
            raise Divergence(f"the snapshot does not restore: {exc}") from None
        if snap.digest and digest != snap.digest:
            raise Divergence("the snapshot's digest is not the engine's")
        try:
            rt.restore(ps, self.parents)
        except (SnapshotMismatch, AssertionError, ValueError, KeyError) as exc:
            raise Divergence(f"the snapshot does not restore: {exc}") from None
        self.digest.refresh()
        self.next_op = snap.ops
        self.synced = True
        self.boundaries.clear()  # digests of before the snapshot prove nothing now
        self._boundary()
