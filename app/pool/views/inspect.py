"""Looking inside the pool: one block, the free queue, the hash map, the
prefix tree.  Each runs on the event loop between engine operations: a
consistent picture of one moment."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any

from pydantic import Field, with_config
from typing_extensions import TypedDict

from app.pool.views.base import ITEM, Ids, Out
from app.shared.errors import InvalidInput, NotFound
from blockpool.common.keys import hash_hex, hex64, key64, key_group, key_hex
from blockpool.runtime.columns import STATE_NAMES

if TYPE_CHECKING:
    from app.pool.engine import Engine


class Block(Out):
    """One block: state, references, hash, queue position, sampled metrics."""

    block_id: int
    state: str
    ref_cnt: int
    is_null: bool
    raw_refs: int
    requests: list[str] = Field(description="the requests holding it")
    block_hash: str | None
    hash64: str | None
    group_id: int | None
    copies_under_hash: int
    queue_position: int | None = Field(description="0 = the next block to be reused")
    queue_stamp: int
    metrics: dict[str, Any] | None = Field(description="when the block is sampled")


@with_config(ITEM)
class QueueItem(TypedDict):
    position: int
    block_id: int
    cached: bool
    hash64: str | None


class Queue(Out):
    """A page of the free queue, in eviction order."""

    total: int
    cached: int
    offset: int
    limit: int
    items: list[QueueItem]


@with_config(ITEM)
class HashMapItem(TypedDict):
    block_hash: str
    hash64: str
    group_id: int
    block_ids: Ids
    multi: bool


class HashMap(Out):
    """A page of the hash -> block map."""

    total_keys: int
    matched: int
    matched_multi: int
    offset: int
    limit: int
    items: list[HashMapItem]


@with_config(ITEM)
class TreeNode(TypedDict):
    hash: str
    parent: str | None
    block_ids: Ids


class PrefixTree(Out):
    """Cached hashes with their parents: the tree of shared prefixes."""

    total: int
    limit: int
    roots: int
    nodes: list[TreeNode]
    partial: bool = Field(
        False, description="some hashes' parents are not known (a mirror after a resync)"
    )
    unknown_parents: int = Field(0, description="hashes shown as roots, their parent unknown")


def block(engine: Engine, block_id: int) -> Block:
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
    metrics: dict[str, Any] | None = None
    state = engine.collector.block_metrics.get(block_id)
    if state is not None:
        metrics = {
            "sampled": True,
            "age_seconds": state.get_lifetime_seconds(),
            "idle_seconds": state.get_idle_time_seconds(),
            "reuse_gaps_seconds": state.get_reuse_gaps_seconds(),
            "accesses_kept": len(state.access_history),
        }
    return Block(
        block_id=block_id,
        state=STATE_NAMES[int(cols.state[block_id])],
        ref_cnt=0 if b.is_null else b.ref_cnt,
        is_null=b.is_null,
        raw_refs=int(engine.raw_refs[block_id]),
        requests=holders,
        block_hash=key[:-4].hex() if key is not None else None,
        hash64=key_hex(key),
        group_id=key_group(key) if key is not None else None,
        copies_under_hash=(
            len(pool.cached_block_hash_to_block.blocks_under(key)) if key is not None else 0
        ),
        queue_position=cols.queue_position(block_id),
        queue_stamp=int(cols.stamp[block_id]),
        metrics=metrics,
    )


def queue(engine: Engine, offset: int, limit: int) -> Queue:
    """The free queue in eviction order (head = next to go), paged."""
    pool = engine.pool
    items: list[QueueItem] = []
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
    return Queue.model_construct(
        total=pool.get_num_free_blocks(),
        cached=engine.columns.counts[2],
        offset=offset,
        limit=limit,
        items=items,
    )


def hash_map(
    engine: Engine,
    offset: int,
    limit: int,
    hash_prefix: str | None,
    block_id: int | None,
    multi_only: bool,
) -> HashMap:
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
    items: list[HashMapItem] = []
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
    return HashMap.model_construct(
        total_keys=len(cache),
        matched=matched,
        matched_multi=multi_keys,
        offset=offset,
        limit=limit,
        items=items,
    )


def prefix_tree(engine: Engine, limit: int) -> PrefixTree:
    """Cached hashes with their parents (from BlockStored), for a prefix tree.
    Hashes are in the 64-bit form events use; ``block_ids`` are the blocks
    holding each one now."""
    ids: dict[str, list[int]] = {}
    for key, blocks in engine.pool.cached_block_hash_to_block.iter_entries():
        ids.setdefault(hex64(key64(key)), []).extend(b.block_id for b in blocks)
    nodes: list[TreeNode] = []
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
    return PrefixTree.model_construct(
        total=len(engine.tree.parents),
        limit=limit,
        roots=roots,
        nodes=nodes,
        partial=orphans > 0,
        unknown_parents=orphans,
    )
