"""Capture and restore: a pool (and its request manager) at one moment, and back.

``capture_pool`` reads everything the next operations depend on: every
block's ref count and hash, the free queue's order, the hash map (keys in
insertion order; one block, or the blocks of a promoted entry in their
order), the running requests (tokens, hashes, block tables, extra keys), the
manager's finished ids and prefix-cache statistics, and the metrics
collector's sampled blocks.  ``restore_pool`` puts a pool and manager of the
same shape into that state: the same operations applied afterwards give the
same block ids, queue order, map, events and samples.  ``check_invariants``
holds after every restore.

It writes the classes' internals (the free queue's links, the map's
entries) so that nothing else has to: keyframes (``runtime.state``), atomic
batches (``runtime.trial``), the mirror's resync and the analysis' replay
rebuild pools through it.  Token and hash lists of running requests are held by reference with
their length (they only ever grow), not copied: a capture is O(blocks +
running requests).  Not kept: the events still queued in the pool (drain
them first) and the sampled blocks' timestamps (restored as fresh).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

from blockpool.core.block import KVCacheBlock
from blockpool.core.hash_map import BlockHashToBlockMap
from blockpool.core.hashing import BlockHash
from blockpool.core.invariants import check_invariants
from blockpool.core.manager import ManagedRequest, PrefixCacheStats, RequestManager
from blockpool.core.metrics import BlockMetricsState
from blockpool.core.pool import BlockPool
from blockpool.core.request import LoRARequest, Request


class SnapshotMismatch(ValueError):
    """The snapshot does not fit the pool it is restored into."""


@dataclass
class RequestSnapshot:
    request_id: str
    prompt: list[int]
    tokens: list[int]  # all token ids (a reference; the first num_tokens count)
    num_tokens: int
    hashes: list[BlockHash]  # fine block hashes (a reference; the first num_hashes count)
    num_hashes: int
    lora_name: str | None
    lora_id: int
    cache_salt: str | None
    tables: list[list[int]]
    num_cached: int
    num_hit: int


@dataclass
class PoolSnapshot:
    """Few, large objects (typed arrays, flat lists): cheap for the garbage
    collector to keep many of."""

    refs: array[int]  # per block
    keys: list[bytes | None]  # per block: its hash key, or None
    queue: array[int]  # free block ids, head first
    map_keys: list[bytes]  # the hash map's keys, in order
    map_ids: array[int]  # the block of each key (the first of a promoted entry)
    map_dicts: dict[int, tuple[int, ...]]  # key index -> block ids of a promoted entry
    requests: list[RequestSnapshot] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    stats: tuple[int, int, int] = (0, 0, 0)
    sampled: list[int] = field(default_factory=list)

    @property
    def num_blocks(self) -> int:
        return len(self.refs)


# --------------------------------------------------------------- reading


def block_key(block: KVCacheBlock) -> bytes | None:
    """A block's hash key (digest + group id), or None: the hot-path read."""
    return block._block_hash


def block_keys(pool: BlockPool) -> list[bytes | None]:
    """Every block's hash key (or None), by block id."""
    return [b._block_hash for b in pool.blocks]


def map_entries(pool: BlockPool) -> dict[bytes, Any]:
    """The hash map as it is: key -> a block, or a {block_id: block} dict for
    a promoted entry.  Read only: never change what this returns."""
    return pool.cached_block_hash_to_block._cache


def queue_ids(pool: BlockPool) -> list[int]:
    """Free block ids from head (next to go) to tail."""
    return [b.block_id for b in pool.free_block_queue]


def finished_ids(manager: RequestManager) -> list[str]:
    """Finished request ids the manager remembers, oldest first."""
    return list(manager._finished)


def capture_pool(pool: BlockPool, manager: RequestManager | None = None) -> PoolSnapshot:
    """The pool's (and manager's) state now."""
    blocks = pool.blocks
    cache = pool.cached_block_hash_to_block._cache
    dicts: dict[int, tuple[int, ...]] = {}
    ids = array("q")
    for i, v in enumerate(cache.values()):
        if v.__class__ is dict:
            dicts[i] = tuple(v)
            ids.append(next(iter(v)) if v else -1)
        else:
            ids.append(v.block_id)
    snap = PoolSnapshot(
        refs=array("q", [b.ref_cnt for b in blocks]),
        keys=[b._block_hash for b in blocks],
        queue=array("q", [b.block_id for b in pool.free_block_queue]),
        map_keys=list(cache),
        map_ids=ids,
        map_dicts=dicts,
    )
    mc = pool.metrics_collector
    if mc is not None:
        snap.sampled = list(mc.block_metrics)
    if manager is not None:
        snap.requests = [_capture_request(rid, m) for rid, m in manager.requests.items()]
        snap.finished = list(manager._finished)
        st = manager.stats
        snap.stats = (st.requests, st.queries, st.hits)
    return snap


def _capture_request(rid: str, m: ManagedRequest) -> RequestSnapshot:
    r = m.request
    lora = r.lora_request
    return RequestSnapshot(
        rid,
        r.prompt_token_ids,
        r.all_token_ids,
        len(r.all_token_ids),
        r.block_hashes,
        len(r.block_hashes),
        lora.lora_name if lora else None,
        lora.lora_int_id if lora else 1,
        r.cache_salt,
        m.block_ids(),
        m.num_cached_blocks,
        m.num_hit_blocks,
    )


# --------------------------------------------------------------- writing


def restore_pool(
    snap: PoolSnapshot,
    pool: BlockPool,
    manager: RequestManager | None = None,
    *,
    check: bool = True,
) -> None:
    """Put ``pool`` (and ``manager``, which must run on it) into the state of
    ``snap``.  The pool must have as many blocks as the snapshot; its queued
    events are dropped.  SnapshotMismatch (nothing changed) when it does not
    fit."""
    blocks = pool.blocks
    if len(blocks) != snap.num_blocks:
        raise SnapshotMismatch(f"snapshot of {snap.num_blocks} blocks, pool of {len(blocks)}")
    if manager is not None and manager.pool is not pool:
        raise SnapshotMismatch("the manager runs on another pool")
    n = len(blocks)
    if any(not 0 <= bid < n for bid in snap.queue):
        raise SnapshotMismatch("the snapshot's queue names a block outside the pool")
    for b, ref, key in zip(blocks, snap.refs, snap.keys, strict=True):
        b.ref_cnt = ref
        b._block_hash = key  # type: ignore[assignment]
        b.prev_free_block = b.next_free_block = None
    q = pool.free_block_queue
    prev = q.fake_free_list_head
    for bid in snap.queue:
        b = blocks[bid]
        prev.next_free_block = b
        b.prev_free_block = prev
        prev = b
    prev.next_free_block = q.fake_free_list_tail
    q.fake_free_list_tail.prev_free_block = prev
    q.num_free_blocks = len(snap.queue)
    new_map = BlockHashToBlockMap()
    cache = new_map._cache
    dicts = snap.map_dicts
    for i, (key, bid) in enumerate(zip(snap.map_keys, snap.map_ids, strict=True)):
        many = dicts.get(i)
        cache[key] = {j: blocks[j] for j in many} if many is not None else blocks[bid]
    pool.cached_block_hash_to_block = new_map
    pool.kv_event_queue = []
    mc = pool.metrics_collector
    if mc is not None:
        mc.reset()
        for bid in snap.sampled:
            mc.block_metrics[bid] = BlockMetricsState(mc.clock)
    if manager is not None:
        _restore_requests(snap, manager)
    if check:
        check_invariants(pool)


def _restore_requests(snap: PoolSnapshot, mgr: RequestManager) -> None:
    blocks = mgr.pool.blocks
    running = []
    for rs in snap.requests:
        lora = LoRARequest(rs.lora_name, rs.lora_id) if rs.lora_name else None
        req = Request(rs.request_id, rs.prompt, lora_request=lora, cache_salt=rs.cache_salt)
        req.all_token_ids = list(rs.tokens[: rs.num_tokens])
        req.block_hashes = list(rs.hashes[: rs.num_hashes])
        tables = [[blocks[i] for i in t] for t in rs.tables]
        running.append((req, tables, rs.num_cached, rs.num_hit))
    mgr.restore(running, snap.finished, PrefixCacheStats(*snap.stats))


# ----------------------------------------------------------------- compare


def pool_digest(pool: BlockPool, manager: RequestManager | None = None) -> dict[str, Any]:
    """Everything observable that a restore or a replay must reproduce."""
    out: dict[str, Any] = {
        "blocks": [(b.block_id, b.ref_cnt, b._block_hash) for b in pool.blocks],
        "queue": [b.block_id for b in pool.free_block_queue],
        "map": [
            (k, ("dict", tuple(v)) if v.__class__ is dict else ("one", v.block_id))
            for k, v in pool.cached_block_hash_to_block._cache.items()
        ],
    }
    mc = pool.metrics_collector
    out["sampled"] = sorted(mc.block_metrics) if mc is not None else []
    if manager is not None:
        out["requests"] = {
            rid: (
                tuple(m.request.all_token_ids),
                tuple(map(tuple, m.block_ids())),
                m.num_cached_blocks,
                m.num_hit_blocks,
            )
            for rid, m in manager.requests.items()
        }
        st = manager.stats
        out["stats"] = (st.requests, st.queries, st.hits)
        out["finished"] = tuple(manager._finished)
    return out


# ------------------------------------------------------------------- JSON


def snapshot_to_json(snap: PoolSnapshot) -> dict[str, Any]:
    return {
        "refs": snap.refs.tolist(),
        "keys": [k.hex() if k is not None else None for k in snap.keys],
        "queue": snap.queue.tolist(),
        "entries": [
            [k.hex(), list(snap.map_dicts[i]) if i in snap.map_dicts else bid]
            for i, (k, bid) in enumerate(zip(snap.map_keys, snap.map_ids, strict=True))
        ],
        "requests": [
            {
                "request_id": r.request_id,
                "prompt": r.prompt,
                "tokens": r.tokens[: r.num_tokens],
                "hashes": [h.hex() for h in r.hashes[: r.num_hashes]],
                "lora_name": r.lora_name,
                "lora_id": r.lora_id,
                "cache_salt": r.cache_salt,
                "tables": r.tables,
                "num_cached": r.num_cached,
                "num_hit": r.num_hit,
            }
            for r in snap.requests
        ],
        "finished": snap.finished,
        "stats": list(snap.stats),
        "sampled": snap.sampled,
    }


def snapshot_from_json(d: dict[str, Any]) -> PoolSnapshot:
    reqs = []
    for r in d["requests"]:
        tokens = list(r["tokens"])
        hashes = [BlockHash(bytes.fromhex(h)) for h in r["hashes"]]
        reqs.append(
            RequestSnapshot(
                r["request_id"],
                list(r["prompt"]),
                tokens,
                len(tokens),
                hashes,
                len(hashes),
                r["lora_name"],
                int(r["lora_id"]),
                r["cache_salt"],
                [list(t) for t in r["tables"]],
                int(r["num_cached"]),
                int(r["num_hit"]),
            )
        )
    return PoolSnapshot(
        refs=array("q", d["refs"]),
        keys=[bytes.fromhex(k) if k is not None else None for k in d["keys"]],
        queue=array("q", d["queue"]),
        map_keys=[bytes.fromhex(k) for k, _ in d["entries"]],
        map_ids=array(
            "q", [(v[0] if v else -1) if isinstance(v, list) else int(v) for _, v in d["entries"]]
        ),
        map_dicts={i: tuple(v) for i, (_, v) in enumerate(d["entries"]) if isinstance(v, list)},
        requests=reqs,
        finished=list(d["finished"]),
        stats=(int(d["stats"][0]), int(d["stats"][1]), int(d["stats"][2])),
        sampled=[int(x) for x in d.get("sampled", [])],
    )
