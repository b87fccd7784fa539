"""Read-only views of the engine's state (JSON-ready dicts).

They run on the event loop between engine operations, so each view is a
consistent picture of one moment.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from itertools import islice
from typing import TYPE_CHECKING, Any

from app.shared.errors import Conflict, InvalidInput, NotFound
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.analysis import views as analysis_views
from blockpool.common.keys import hash_hex, hex64, key64, key_group, key_hex
from blockpool.runtime.columns import STATE_NAMES
from blockpool.runtime.summary import pool_summary

if TYPE_CHECKING:
    from app.pool.engine import Engine


def config(engine: Engine) -> dict[str, Any]:
    s = engine.settings
    pool = engine.pool
    out: dict[str, Any] = {
        "num_blocks": pool.num_gpu_blocks,
        "block_size": s.block_size,
        "hash_block_size": pool.hash_block_size,
        "num_groups": s.num_groups,
        "hash_fn": s.hash_fn,
        "enable_caching": pool.enable_caching,
        "enable_events": pool.enable_kv_cache_events,
        "metrics_sample_rate": engine.collector.sample_rate,
        "strict": pool.strict,
        "model_name": s.model_name,
        "tick_hz": s.tick_hz,
        "auth_required_for_writes": s.token is not None,
        "auth_required_for_reads": s.token is not None and s.protect_reads,
        "limits": {
            "max_body_bytes": s.max_body_bytes,
            "max_ids_per_call": s.max_ids_per_call,
            "max_tokens_per_request": s.max_tokens_per_request,
            "max_batch_ops": s.max_batch_ops,
            "max_requests": s.max_requests,
        },
        "storage": engine.storage_facts(),
    }
    return out


def tokens(engine: Engine) -> dict[str, Any]:
    """Token usage beside block usage (null figures with ``reason`` where the
    service cannot know them: ``Engine.unknown``)."""
    out: dict[str, Any] = analysis_views.tokens(engine.runtime, engine.unknown.get("tokens"))
    return out


def headline(engine: Engine) -> dict[str, Any]:
    """``pool_summary`` with the requests the service knows of: on a mirror
    the engine's (None where not known, ``requests_reason`` says why).  REST's
    summary and every stream frame's header carry it."""
    reqs = engine.request_counts()
    return {
        **pool_summary(engine.runtime),
        "running_requests": reqs["running"],
        "waiting_requests": reqs["waiting"],
        "requests_reason": reqs["reason"],
    }


def summary(engine: Engine) -> dict[str, Any]:
    c = engine.counters
    reqs = engine.request_counts()
    return {
        **headline(engine),
        "groups": list(engine.manager.group_ids),
        "tokens": tokens(engine),
        "counters": {
            "operations": c.ops,
            "operations_refused": c.ops_failed,
            "blocks_allocated": c.blocks_allocated,
            "blocks_freed": c.blocks_freed,
            "blocks_touched": c.blocks_touched,
            "blocks_cached": c.blocks_cached,
            "evictions": c.evictions,
            "resets": c.resets,
            "resets_refused": c.resets_refused,
            # on a mirror the engine's (None: not known, requests_reason says why)
            "requests_admitted": reqs["admitted"],
            "requests_refused": reqs["refused"],
            "requests_finished": reqs["finished"],
            "events": dict(c.events),
        },
        "event_log": {
            "last_seq": engine.events.last_seq,
            "first_seq": engine.events.first_seq,
            "dropped": engine.events.dropped,
            "lost_before_tick": engine.events_lost_to_ticks,
        },
        "uptime_s": time.time() - engine.started_at,
    }


def block(engine: Engine, block_id: int) -> dict[str, Any]:
    pool = engine.pool
    if not 0 <= block_id < pool.num_gpu_blocks:
        raise NotFound(
            f"block {block_id} does not exist (ids 0..{pool.num_gpu_blocks - 1})",
            block_id=block_id,
        )
    b = pool.blocks[block_id]
    cols = engine.columns
    key = b.block_hash
    holders = [
        rid
        for rid, managed in engine.manager.requests.items()
        if any(x.block_id == block_id for table in managed.block_tables for x in table)
    ]
    out: dict[str, Any] = {
        "block_id": block_id,
        "state": STATE_NAMES[int(cols.state[block_id])],
        "ref_cnt": 0 if b.is_null else b.ref_cnt,
        "is_null": b.is_null,
        "raw_refs": int(engine.raw_refs[block_id]),
        "requests": holders,
        "block_hash": key[:-4].hex() if key is not None else None,
        "hash64": key_hex(key),
        "group_id": key_group(key) if key is not None else None,
        "copies_under_hash": (
            len(pool.cached_block_hash_to_block.blocks_under(key)) if key is not None else 0
        ),
        "queue_position": cols.queue_position(block_id),
        "queue_stamp": int(cols.stamp[block_id]),
        "metrics": None,
    }
    state = engine.collector.block_metrics.get(block_id)
    if state is not None:
        out["metrics"] = {
            "sampled": True,
            "age_seconds": state.get_lifetime_seconds(),
            "idle_seconds": state.get_idle_time_seconds(),
            "reuse_gaps_seconds": state.get_reuse_gaps_seconds(),
            "accesses_kept": len(state.access_history),
        }
    return out


def queue(engine: Engine, offset: int, limit: int) -> dict[str, Any]:
    """The free queue in eviction order (head = next to go), paged."""
    pool = engine.pool
    items = []
    for pos, b in enumerate(islice(pool.free_block_queue, offset, offset + limit), start=offset):
        key = b.block_hash
        items.append(
            {
                "position": pos,
                "block_id": b.block_id,
                "cached": key is not None,
                "hash64": key_hex(key),
            }
        )
    return {
        "total": pool.get_num_free_blocks(),
        "cached": engine.columns.counts[2],
        "offset": offset,
        "limit": limit,
        "items": items,
    }


def hash_map(
    engine: Engine,
    offset: int,
    limit: int,
    hash_prefix: str | None,
    block_id: int | None,
    multi_only: bool,
) -> dict[str, Any]:
    """Hash map entries, paged; filter by hash (hex prefix of the digest or of
    its 64-bit form), by block id, or to keys holding several blocks."""
    cache = engine.pool.cached_block_hash_to_block
    entries: Any
    if block_id is not None:
        if not 0 <= block_id < engine.pool.num_gpu_blocks:
            raise InvalidInput(f"block id {block_id} is outside the pool", block_id=block_id)
        key = engine.pool.blocks[block_id].block_hash
        entries = [(key, cache.blocks_under(key))] if key is not None else []
    else:
        entries = cache.iter_entries()
    prefix = hash_prefix.lower() if hash_prefix else None
    matched = 0
    items: list[dict[str, Any]] = []
    multi_keys = 0
    for key, blocks in entries:
        if multi_only and len(blocks) < 2:
            continue
        h64 = hex64(key64(key))
        if prefix and not (key[:-4].hex().startswith(prefix) or h64.startswith(prefix)):
            continue
        if matched >= offset and len(items) < limit:
            items.append(
                {
                    "block_hash": key[:-4].hex(),
                    "hash64": h64,
                    "group_id": key_group(key),
                    "block_ids": [b.block_id for b in blocks],
                    "multi": len(blocks) > 1,
                }
            )
        matched += 1
        multi_keys += len(blocks) > 1
    return {
        "total_keys": len(cache),
        "matched": matched,
        "matched_multi": multi_keys,
        "offset": offset,
        "limit": limit,
        "items": items,
    }


def prefix_tree(engine: Engine, limit: int) -> dict[str, Any]:
    """Cached hashes with their parents (from BlockStored), for a prefix tree.
    Hashes are in the 64-bit form events use; ``block_ids`` are the blocks
    holding each one now."""
    ids: dict[str, list[int]] = {}
    for key, blocks in engine.pool.cached_block_hash_to_block.iter_entries():
        ids.setdefault(hex64(key64(key)), []).extend(b.block_id for b in blocks)
    nodes = []
    for h, parent in islice(engine.tree.parents.items(), limit):
        hx = hash_hex(h)
        nodes.append(
            {
                "hash": hx,
                "parent": None if parent is None else hash_hex(parent),
                "block_ids": ids.get(hx, []),
            }
        )
    known = {n["hash"] for n in nodes}
    roots = sum(1 for n in nodes if n["parent"] is None or n["parent"] not in known)
    orphans = len(engine.tree.orphans)
    return {
        "total": len(engine.tree.parents),
        "limit": limit,
        "roots": roots,
        "nodes": nodes,
        "partial": orphans > 0,
        "unknown_parents": orphans,
    }


def event_json(seq: int, ts: float, ev: KVCacheEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"seq": seq, "ts": ts, "type": type(ev).__name__}
    if isinstance(ev, BlockStored):
        out.update(
            block_hashes=[hash_hex(h) for h in ev.block_hashes],
            parent_block_hash=None
            if ev.parent_block_hash is None
            else hash_hex(ev.parent_block_hash),
            token_ids=ev.token_ids,
            block_size=ev.block_size,
            lora_id=ev.lora_id,
            lora_name=ev.lora_name,
            medium=ev.medium,
        )
    elif isinstance(ev, BlockRemoved):
        out.update(block_hashes=[hash_hex(h) for h in ev.block_hashes], medium=ev.medium)
    elif isinstance(ev, AllBlocksCleared):
        pass
    return out


def events(engine: Engine, since: int, limit: int, types: set[str] | None) -> dict[str, Any]:
    entries, truncated = engine.events.since(since, limit)
    items = [event_json(seq, ts, ev) for seq, ts, ev in entries]
    if types:
        items = [e for e in items if e["type"] in types]
    return {
        "since": since,
        "last_seq": engine.events.last_seq,
        "first_seq": engine.events.first_seq,
        "truncated": truncated,
        "dropped_total": engine.events.dropped,
        "next": entries[-1][0] if entries else since,
        "items": items,
    }


def samples(engine: Engine, since: int, limit: int) -> dict[str, Any]:
    entries, truncated = engine.samples.since(since, limit)
    return {
        "since": since,
        "last_seq": engine.samples.last_seq,
        "truncated": truncated,
        "dropped_total": engine.samples.dropped,
        "next": entries[-1][0] if entries else since,
        "sample_rate": engine.collector.sample_rate,
        "items": [
            {
                "seq": seq,
                "ts": ts,
                "lifetime_seconds": s.lifetime_seconds,
                "idle_seconds": s.idle_seconds,
                "reuse_gaps_seconds": list(s.reuse_gaps_seconds),
            }
            for seq, ts, s in entries
        ],
        "histograms": {
            name: {
                "buckets": [b if math.isfinite(b) else "+Inf" for b, _ in h.cumulative()],
                "cumulative_counts": [c for _, c in h.cumulative()],
                "sum": h.sum,
                "count": h.count,
            }
            for name, h in engine.histograms.items()
        },
    }


def request(engine: Engine, rid: str) -> dict[str, Any]:
    managed = engine.manager.requests.get(rid)
    if managed is None:
        raise NotFound(f"no running request {rid!r}", request_id=rid)
    req = managed.request
    bs = engine.manager.block_size
    reasons = engine.analysis.block_reasons(rid) if engine.analysis else []
    return {
        "request_id": rid,
        "num_tokens": req.num_tokens,
        "num_prompt_tokens": req.num_prompt_tokens,
        "block_ids": managed.block_ids(),
        "num_hit_blocks": managed.num_hit_blocks,
        "num_cached_blocks": managed.num_cached_blocks,
        "lora_name": req.lora_request.lora_name if req.lora_request else None,
        "cache_salt": req.cache_salt,
        "blocks": [
            {
                "index": i,
                "block_ids": [table[i].block_id for table in managed.block_tables],
                "tokens": min(bs, req.num_tokens - i * bs),
                "hit": i < managed.num_hit_blocks,
                "block_hash": managed.block_hashes[i].hex()
                if i < len(managed.block_hashes)
                else None,
                # why a prompt block missed (None: a hit, or a decode block)
                "reason": reasons[i][0] if i < len(reasons) else None,
                "miss": reasons[i][1] if i < len(reasons) else None,
            }
            for i in range(len(managed.block_tables[0]))
        ],
        "misses": dict(Counter(r for r, _ in reasons if r is not None)),
    }


def verify(engine: Engine, rid: str) -> dict[str, Any]:
    if engine.storage is None:
        raise Conflict("verify: the server runs without K/V storage (--no-storage)")
    managed = engine.manager.requests.get(rid)
    if managed is None:
        raise NotFound(f"no running request {rid!r}", request_id=rid)
    result: dict[str, Any] = engine.storage.verify(managed)
    result["request_id"] = rid
    return result


def requests(engine: Engine, offset: int, limit: int) -> dict[str, Any]:
    if engine.request_listing is not None:  # a mirror's: the engine's running requests
        return engine.request_listing(offset, limit)
    reqs = engine.manager.requests
    items = [
        {
            "request_id": rid,
            "num_tokens": m.num_tokens,
            "num_blocks": len(m.block_tables[0]),
            "num_hit_blocks": m.num_hit_blocks,
        }
        for rid, m in islice(reqs.items(), offset, offset + limit)
    ]
    return {"total": len(reqs), "offset": offset, "limit": limit, "items": items}


def series(engine: Engine, limit: int) -> dict[str, Any]:
    pts = list(engine.series)[-limit:]
    return {"tick_hz": engine.settings.tick_hz, "points": [_finite(p) for p in pts]}


def _finite(p: dict[str, float]) -> dict[str, float | None]:
    return {k: (v if math.isfinite(v) else None) for k, v in p.items()}
