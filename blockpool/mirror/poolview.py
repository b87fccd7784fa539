"""Reading a pool into a ``Snapshot`` message, and a snapshot back into a
``PoolSnapshot`` that ``restore_pool`` puts into a pool.

Both blockpool's ``BlockPool`` and vLLM's (0.16 and later) have the same
shape where it matters (see blockpool/mirror/digest.py), so one reader
serves the engine's pool and the mirror's.  The null block (id 0) reads as
free and unhashed: vLLM does not keep its ref count.

A snapshot carries the queue as links (each block's neighbours) and the
hash map as the blocks' keys plus the order of the keys held by several
blocks: everything per block, so that the engine can copy it block by block
(blockpool_vllm/capture.py) and the mirror rebuild the order.
"""

from __future__ import annotations

from array import array

from blockpool.core.snapshot import PoolSnapshot
from blockpool.mirror.digest import (
    FIRST,
    NOT_MAPPED,
    NOT_QUEUED,
    block_value,
    format_digest,
    map_link,
)
from blockpool.mirror.pool_shape import PoolBlock, ReadPool
from blockpool.mirror.protocol import Snapshot


class BadSnapshot(ValueError):
    """A snapshot whose parts do not make a pool."""


def free_ids(pool: ReadPool) -> list[int]:
    """Free block ids, head (next to go) first."""
    out: list[int] = []
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    b = q.fake_free_list_head.next_free_block
    while b is not None and b is not tail:
        out.append(b.block_id)
        b = b.next_free_block
    return out


def duplicate_keys(pool: ReadPool) -> list[tuple[bytes, list[int]]]:
    """The map's keys held by more than one block, their blocks in order."""
    return [
        (bytes(k), list(v))
        for k, v in pool.cached_block_hash_to_block._cache.items()
        if isinstance(v, dict) and len(v) > 1
    ]


def _links(b: PoolBlock) -> tuple[int, int]:
    p, n = b.prev_free_block, b.next_free_block
    return (NOT_QUEUED if p is None else p.block_id), (NOT_QUEUED if n is None else n.block_id)


def snapshot_of(
    pool: ReadPool,
    ops: int,
    seq: int,
    ts: float,
    stats: tuple[int, int, int],
    *,
    digest: str = "",
    boot: str = "",
) -> Snapshot:
    """The whole pool as a Snapshot message, read at once (O(pool))."""
    blocks = pool.blocks
    n = len(blocks)
    refs = array("i", bytes(4 * n))
    prev = array("i", [NOT_QUEUED]) * n
    nxt = array("i", [NOT_QUEUED]) * n
    lens = bytearray(n)
    keys: list[bytes] = []
    for b in blocks[1:]:
        bid = b.block_id
        refs[bid] = b.ref_cnt
        prev[bid], nxt[bid] = _links(b)
        k = b.block_hash
        if k is not None:
            kb = bytes(k)
            lens[bid] = len(kb)
            keys.append(kb)
    return Snapshot(
        ops=ops,
        seq=seq,
        ts=ts,
        num_blocks=n,
        refs=refs.tobytes(),
        prev=prev.tobytes(),
        next=nxt.tobytes(),
        key_lens=bytes(lens),
        keys=b"".join(keys),
        dups=duplicate_keys(pool),
        stats=stats,
        problems=[],
        digest=digest,
        boot=boot,
    )


def _ints(data: bytes, n: int, what: str) -> array[int]:
    if len(data) != 4 * n:
        raise BadSnapshot(f"{what}: {len(data)} bytes for {n} blocks")
    a = array("i")
    a.frombytes(data)
    return a


def parts_of(snap: Snapshot) -> tuple[array[int], array[int], array[int], list[bytes | None]]:
    """refs, prev, next and keys per block, checked for size."""
    n = snap.num_blocks
    refs = _ints(snap.refs, n, "refs")
    prev = _ints(snap.prev, n, "prev")
    nxt = _ints(snap.next, n, "next")
    if len(snap.key_lens) != n:
        raise BadSnapshot(f"key_lens: {len(snap.key_lens)} bytes for {n} blocks")
    if sum(snap.key_lens) != len(snap.keys):
        raise BadSnapshot("keys: not as long as key_lens says")
    keys: list[bytes | None] = [None] * n
    data, at = snap.keys, 0
    for bid, ln in enumerate(snap.key_lens):
        if ln:
            keys[bid] = data[at : at + ln]
            at += ln
    return refs, prev, nxt, keys


def snapshot_digest(snap: Snapshot) -> str:
    """The digest of the pool a snapshot describes (blockpool/mirror/digest.py)."""
    return to_pool_snapshot(snap)[1]


def to_pool_snapshot(snap: Snapshot) -> tuple[PoolSnapshot, str]:
    """The snapshot as ``restore_pool`` takes it, and its digest (BadSnapshot:
    its parts do not make a pool: sizes, a queue that is not one chain, a
    duplicate key list that disagrees with the blocks' keys)."""
    n = snap.num_blocks
    refs, prev, nxt, keys = parts_of(snap)
    refs[0] = 0
    # the free queue: the chain from the block whose prev is the head
    heads = [bid for bid in range(1, n) if prev[bid] == -1]
    queued = sum(1 for bid in range(1, n) if prev[bid] != NOT_QUEUED)
    queue = array("q")
    if heads:
        if len(heads) != 1:
            raise BadSnapshot(f"the free queue has {len(heads)} heads")
        b = heads[0]
        while b != -1:
            if not 0 < b < n or len(queue) > queued:
                raise BadSnapshot("the free queue's links do not make one chain")
            queue.append(b)
            nb = nxt[b]
            if nb != -1 and (not 0 < nb < n or prev[nb] != b):
                raise BadSnapshot(f"the free queue's links disagree at block {b}")
            b = nb
    if len(queue) != queued:
        raise BadSnapshot(f"{queued} blocks queued, the chain holds {len(queue)}")
    # the hash map: every hashed block under its key; duplicates as told
    dup_order: dict[bytes, list[int]] = {}
    for key, ids in snap.dups:
        if len(ids) < 2 or any(not 0 < i < n or keys[i] != key for i in ids):
            raise BadSnapshot("a duplicate key's blocks do not hold that key")
        dup_order[key] = ids
    held: dict[bytes, list[int]] = {}
    for bid in range(1, n):
        k = keys[bid]
        if k is not None:
            held.setdefault(k, []).append(bid)
    map_keys: list[bytes] = []
    map_ids = array("q")
    map_dicts: dict[int, tuple[int, ...]] = {}
    links: dict[int, int] = {}  # each hashed block's map link (digest.py)
    for key, ids in held.items():
        if len(ids) > 1:
            order = dup_order.get(key)
            if order is None or sorted(order) != ids:
                raise BadSnapshot("a key held by several blocks has no order")
            map_dicts[len(map_keys)] = tuple(order)
            ids = order
        links.update(zip(ids, [FIRST, *ids[:-1]], strict=True))
        map_keys.append(key)
        map_ids.append(ids[0])
    total = n
    for bid in range(1, n):
        link = links.get(bid, NOT_MAPPED)
        total += block_value(bid, refs[bid], prev[bid], nxt[bid], link, keys[bid])
    ps = PoolSnapshot(
        refs=array("q", refs),
        keys=keys,
        queue=queue,
        map_keys=map_keys,
        map_ids=map_ids,
        map_dicts=map_dicts,
        stats=snap.stats,
    )
    return ps, format_digest(total)


__all__ = [
    "BadSnapshot",
    "duplicate_keys",
    "free_ids",
    "map_link",
    "parts_of",
    "snapshot_digest",
    "snapshot_of",
    "to_pool_snapshot",
]
