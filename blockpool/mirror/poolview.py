"""Reading a pool for the mirror: its digest and its whole state.

Both blockpool's ``BlockPool`` and vLLM's (0.16 and later) have the same
shape where it matters -- ``blocks`` with ``ref_cnt`` and ``block_hash`` (the
hash followed by the 4-byte group id), the free queue as a linked list from
``free_block_queue.fake_free_list_head``, the hash map's ``_cache`` (a key to
a block or to a ``{block_id: block}`` dict) -- so one reader serves the
engine's pool and the mirror's.  The null block (id 0) is left out: vLLM
does not keep its ref count.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from blockpool.mirror.protocol import Snapshot


def free_ids(pool: Any) -> list[int]:
    """Free block ids, head (next to go) first."""
    out: list[int] = []
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    b = q.fake_free_list_head.next_free_block
    while b is not None and b is not tail:
        out.append(b.block_id)
        b = b.next_free_block
    return out


def map_entries(pool: Any) -> list[tuple[bytes, list[int]]]:
    """The hash map in insertion order: each key with its block ids."""
    out: list[tuple[bytes, list[int]]] = []
    for key, v in pool.cached_block_hash_to_block._cache.items():
        ids = list(v) if isinstance(v, dict) else [v.block_id]
        out.append((bytes(key), ids))
    return out


def digest_parts(
    refs: list[int],
    keys: list[bytes | None],
    queue: list[int],
    entries: list[tuple[bytes, list[int]]],
) -> str:
    """The digest of a pool's state given as its parts (block 0 skipped)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(struct.pack("<I", len(refs)))
    pack = struct.pack
    for bid in range(1, len(refs)):
        key = keys[bid]
        h.update(pack("<iH", refs[bid], 0 if key is None else len(key) + 1))
        if key is not None:
            h.update(key)
    h.update(pack(f"<I{len(queue)}I", len(queue), *queue))
    for key, ids in entries:
        h.update(pack(f"<HH{len(ids)}I", len(key), len(ids), *ids))
        h.update(key)
    return h.hexdigest()


def pool_digest(pool: Any) -> str:
    """The digest of a pool now: ref counts, hashes, queue order, the map."""
    blocks = pool.blocks
    refs = [b.ref_cnt for b in blocks]
    keys = [None if b.block_hash is None else bytes(b.block_hash) for b in blocks]
    return digest_parts(refs, keys, free_ids(pool), map_entries(pool))


def snapshot_of(pool: Any, ops: int, seq: int, ts: float, stats: tuple[int, int, int]) -> Snapshot:
    """The whole pool as a Snapshot message."""
    blocks = pool.blocks
    refs = [b.ref_cnt for b in blocks]
    refs[0] = 0
    return Snapshot(
        ops=ops,
        seq=seq,
        ts=ts,
        refs=refs,
        keys=[None if b.block_hash is None else bytes(b.block_hash) for b in blocks],
        queue=free_ids(pool),
        entries=map_entries(pool),
        stats=stats,
        problems=[],
    )


def snapshot_digest(snap: Snapshot) -> str:
    return digest_parts(snap.refs, snap.keys, snap.queue, snap.entries)
