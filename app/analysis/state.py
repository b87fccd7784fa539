"""Keyframes: the engine's whole state at one moment, and back.

A keyframe holds what the next operations depend on -- every block's ref
count and hash, the free queue's order, the hash map (keys in order, one
block or a dict of copies in insertion order), the running requests (tokens,
hashes, block tables, extra keys), the manager's finished ids and prefix-cache
stats, the engine's counters, raw references and request-id counter, the
metrics collector's random state and sampled blocks -- so that restoring it
into a fresh engine and applying the same operations gives the same block
ids, queue order, map and events.  Token and hash lists are referenced with
their length then (they only ever grow), not copied.

Not kept: the K/V tensors (metadata only), the sampled blocks' timestamps
(restored as fresh), the prefix tree and the logs (they follow from events).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.counters import Counters
from blockpool import (
    BlockHash,
    BlockHashToBlockMap,
    BlockMetricsState,
    LoRARequest,
    ManagedRequest,
    PrefixCacheStats,
    Request,
)

if TYPE_CHECKING:
    from app.engine import Engine


@dataclass
class RequestState:
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
class Keyframe:
    """Few, large objects (arrays, flat lists): a keyframe is cheap for the
    garbage collector to keep."""

    seq: int
    ts: float
    refs: np.ndarray  # int64 per block
    keys: list[bytes | None]
    queue: np.ndarray  # block ids, head first
    map_keys: list[bytes]  # the hash map's keys, in order
    map_ids: np.ndarray  # the block of each key (the first of a dict)
    map_dicts: dict[int, tuple[int, ...]]  # key index -> block ids of a dict entry
    requests: list[RequestState]
    finished: list[str]
    stats: tuple[int, int, int]
    counters: dict[str, Any]
    raw_refs: list[tuple[int, int]]
    next_request: int
    rng_state: Any
    sampled: list[int]
    tail_waste: int


def snapshot(engine: Engine, seq: int, ts: float) -> Keyframe:
    """The engine's state now (O(blocks + running requests))."""
    pool = engine.pool
    blocks = pool.blocks
    cache = pool.cached_block_hash_to_block._cache
    dicts: dict[int, tuple[int, ...]] = {}
    ids = []
    for i, v in enumerate(cache.values()):
        if v.__class__ is dict:
            dicts[i] = tuple(v)
            ids.append(next(iter(v)) if v else -1)
        else:
            ids.append(v.block_id)
    reqs = []
    for rid, m in engine.manager.requests.items():
        r = m.request
        lora = r.lora_request
        reqs.append(
            RequestState(
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
        )
    raw = engine.raw_refs
    nz = np.flatnonzero(raw)
    st = engine.manager.stats
    return Keyframe(
        seq=seq,
        ts=ts,
        refs=np.array([b.ref_cnt for b in blocks], dtype=np.int64),
        keys=[b._block_hash for b in blocks],
        queue=engine.columns.queue_order().astype(np.int64),
        map_keys=list(cache),
        map_ids=np.array(ids, dtype=np.int64),
        map_dicts=dicts,
        requests=reqs,
        finished=list(engine.manager._finished),
        stats=(st.requests, st.queries, st.hits),
        counters=dataclasses.asdict(engine.counters),
        raw_refs=list(zip(nz.tolist(), raw[nz].tolist(), strict=True)),
        next_request=engine._next_request,
        rng_state=engine.rng.getstate() if engine.rng is not None else None,
        sampled=list(engine.collector.block_metrics),
        tail_waste=engine.tail_waste,
    )


def restore(engine: Engine, kf: Keyframe) -> None:
    """Put a fresh engine (same settings) into the keyframe's state."""
    pool = engine.pool
    blocks = pool.blocks
    if len(blocks) != len(kf.refs):
        raise ValueError(f"keyframe of {len(kf.refs)} blocks, engine of {len(blocks)}")
    for b, ref, key in zip(blocks, kf.refs.tolist(), kf.keys, strict=True):
        b.ref_cnt = ref
        b._block_hash = key  # type: ignore[assignment]
        b.prev_free_block = b.next_free_block = None
    q = pool.free_block_queue
    prev = q.fake_free_list_head
    for bid in kf.queue.tolist():
        b = blocks[bid]
        prev.next_free_block = b
        b.prev_free_block = prev
        prev = b
    prev.next_free_block = q.fake_free_list_tail
    q.fake_free_list_tail.prev_free_block = prev
    q.num_free_blocks = len(kf.queue)
    new_map = BlockHashToBlockMap()
    cache = new_map._cache
    dicts = kf.map_dicts
    for i, (key, bid) in enumerate(zip(kf.map_keys, kf.map_ids.tolist(), strict=True)):
        many = dicts.get(i)
        cache[key] = {j: blocks[j] for j in many} if many is not None else blocks[bid]
    pool.cached_block_hash_to_block = new_map
    pool.kv_event_queue = []
    mgr = engine.manager
    mgr.requests = {}
    for rs in kf.requests:
        lora = LoRARequest(rs.lora_name, rs.lora_id) if rs.lora_name else None
        req = Request(rs.request_id, rs.prompt, lora_request=lora, cache_salt=rs.cache_salt)
        req.all_token_ids = list(rs.tokens[: rs.num_tokens])
        req.block_hashes = list(rs.hashes[: rs.num_hashes])
        req._block_hasher = mgr._hasher
        tables = [[blocks[i] for i in t] for t in rs.tables]
        mgr.requests[rs.request_id] = ManagedRequest(
            req, tables, rs.num_cached, rs.num_hit, mgr._view(req)
        )
    mgr._finished = OrderedDict.fromkeys(kf.finished)
    mgr.stats = PrefixCacheStats(*kf.stats)
    counters = dict(kf.counters)
    counters["events"] = dict(counters["events"])
    engine.counters = Counters(**counters)
    engine.raw_refs[:] = 0
    for bid, n in kf.raw_refs:
        engine.raw_refs[bid] = n
    engine._next_request = kf.next_request
    if engine.rng is not None and kf.rng_state is not None:
        engine.rng.setstate(kf.rng_state)
    mc = engine.collector
    mc.reset()
    for bid in kf.sampled:
        mc.block_metrics[bid] = BlockMetricsState(mc.clock)
    engine.tail_waste = kf.tail_waste
    engine.parents.clear()
    engine.copies.clear()
    engine.mark_all_dirty()
    engine.columns.take_dirty()


def digest(engine: Engine) -> dict[str, Any]:
    """Everything observable that replay must reproduce (tests, verification)."""
    pool = engine.pool
    return {
        "blocks": [(b.block_id, b.ref_cnt, b._block_hash) for b in pool.blocks],
        "queue": [b.block_id for b in pool.free_block_queue],
        "map": [
            (k, ("dict", tuple(v)) if v.__class__ is dict else ("one", v.block_id))
            for k, v in pool.cached_block_hash_to_block._cache.items()
        ],
        "requests": {
            rid: (
                tuple(m.request.all_token_ids),
                tuple(map(tuple, m.block_ids())),
                m.num_cached_blocks,
                m.num_hit_blocks,
            )
            for rid, m in engine.manager.requests.items()
        },
        "raw_refs": tuple(engine.raw_refs.tolist()),
        "stats": dataclasses.astuple(engine.manager.stats),
        "finished": tuple(engine.manager._finished),
        # (not ``ops``: it also counts closures run on the engine, e.g. a batch)
        "counters": repr(
            {k: v for k, v in dataclasses.asdict(engine.counters).items() if k != "ops"}
        ),
        "next_request": engine._next_request,
        "sampled": sorted(engine.collector.block_metrics),
    }


# ------------------------------------------------------------------- JSON


def keyframe_json(kf: Keyframe) -> dict[str, Any]:
    return {
        "seq": kf.seq,
        "ts": kf.ts,
        "refs": kf.refs.tolist(),
        "keys": [k.hex() if k is not None else None for k in kf.keys],
        "queue": kf.queue.tolist(),
        "entries": [
            [k.hex(), list(kf.map_dicts[i]) if i in kf.map_dicts else bid]
            for i, (k, bid) in enumerate(zip(kf.map_keys, kf.map_ids.tolist(), strict=True))
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
            for r in kf.requests
        ],
        "finished": kf.finished,
        "stats": list(kf.stats),
        "counters": kf.counters,
        "raw_refs": [list(p) for p in kf.raw_refs],
        "next_request": kf.next_request,
        "rng_state": _rng_json(kf.rng_state),
        "sampled": kf.sampled,
        "tail_waste": kf.tail_waste,
    }


def keyframe_from_json(d: dict[str, Any]) -> Keyframe:
    reqs = []
    for r in d["requests"]:
        tokens = list(r["tokens"])
        hashes = [BlockHash(bytes.fromhex(h)) for h in r["hashes"]]
        reqs.append(
            RequestState(
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
    return Keyframe(
        seq=int(d["seq"]),
        ts=float(d["ts"]),
        refs=np.array(d["refs"], dtype=np.int64),
        keys=[bytes.fromhex(k) if k is not None else None for k in d["keys"]],
        queue=np.array(d["queue"], dtype=np.int64),
        map_keys=[bytes.fromhex(k) for k, _ in d["entries"]],
        map_ids=np.array(
            [(v[0] if v else -1) if isinstance(v, list) else int(v) for _, v in d["entries"]],
            dtype=np.int64,
        ),
        map_dicts={i: tuple(v) for i, (_, v) in enumerate(d["entries"]) if isinstance(v, list)},
        requests=reqs,
        finished=list(d["finished"]),
        stats=(int(d["stats"][0]), int(d["stats"][1]), int(d["stats"][2])),
        counters=dict(d["counters"]),
        raw_refs=[(int(a), int(b)) for a, b in d["raw_refs"]],
        next_request=int(d["next_request"]),
        rng_state=_rng_from_json(d["rng_state"]),
        sampled=[int(x) for x in d["sampled"]],
        tail_waste=int(d.get("tail_waste", 0)),
    )


def _rng_json(state: Any) -> Any:
    if state is None:
        return None
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(d: Any) -> Any:
    if d is None:
        return None
    return (d[0], tuple(d[1]), d[2])
