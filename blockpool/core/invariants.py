"""check_invariants: an O(n) audit of a BlockPool (sortedcontainers' _check).

Checked: the free queue's links agree both ways from sentinel to sentinel,
hold no block twice and match ``num_free_blocks``; free blocks have ref count
0 and held blocks a positive one; unqueued blocks have no links; the null
block is block 0, never queued and never cached; every block's hash is a key
of the map holding that very block, and every block in the map carries the
key it is filed under.  ``check_coordinator`` adds a coordinator's block
tables to the audit.  On failure InvariantError lists every problem found
and a short dump of the pool.
"""

from __future__ import annotations

from blockpool.core.block import KVCacheBlock
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.errors import BlockPoolError
from blockpool.core.pool import BlockPool

_MAX_LISTED = 20


class InvariantError(BlockPoolError, AssertionError):
    """The pool's internal state is inconsistent."""

    def __init__(self, problems: list[str], dump: str) -> None:
        self.problems = problems
        shown = problems[:_MAX_LISTED]
        more = len(problems) - len(shown)
        text = "\n".join(f"  - {p}" for p in shown)
        if more:
            text += f"\n  ... and {more} more"
        super().__init__(f"{len(problems)} invariant violation(s):\n{text}\n{dump}")


def _ids(blocks: list[KVCacheBlock], limit: int = 16) -> str:
    head = ", ".join(str(b.block_id) for b in blocks[:limit])
    return f"[{head}{', ...' if len(blocks) > limit else ''}] ({len(blocks)})"


def _dump(pool: BlockPool, queue_ids: list[KVCacheBlock]) -> str:
    held = [b for b in pool.blocks if b.ref_cnt > 0 and not b.is_null]
    return (
        f"pool: {pool.num_gpu_blocks} blocks, num_free_blocks="
        f"{pool.free_block_queue.num_free_blocks}, map keys="
        f"{len(pool.cached_block_hash_to_block)}\n"
        f"  queue head->tail: {_ids(queue_ids)}\n"
        f"  held: {', '.join(f'{b.block_id}(ref {b.ref_cnt})' for b in held[:16])}"
        f"{' ...' if len(held) > 16 else ''}"
    )


def _walk_queue(pool: BlockPool, problems: list[str]) -> list[KVCacheBlock]:
    queue = pool.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    n = len(pool.blocks)
    seen = bytearray(n)
    order: list[KVCacheBlock] = []
    if head.block_id != -1 or tail.block_id != -1:
        problems.append("sentinel blocks must have id -1")
    if head.prev_free_block is not None or tail.next_free_block is not None:
        problems.append("sentinels must not link outwards")
    prev, curr = head, head.next_free_block
    while curr is not None and curr is not tail:
        bid = curr.block_id
        if curr.prev_free_block is not prev:
            problems.append(
                f"queue link broken: block {bid}.prev is "
                f"{getattr(curr.prev_free_block, 'block_id', None)}, expected {prev.block_id}"
            )
        if not (0 <= bid < n) or pool.blocks[bid] is not curr:
            problems.append(f"queue holds a block not of this pool: {curr!r}")
            break
        if seen[bid]:
            problems.append(f"block {bid} is in the queue twice (cycle)")
            break
        seen[bid] = 1
        order.append(curr)
        if len(order) > n:
            problems.append("queue longer than the pool")
            break
        prev, curr = curr, curr.next_free_block
    if curr is None:
        problems.append(
            f"queue ends without reaching the tail sentinel after block {prev.block_id}"
        )
    elif tail.prev_free_block is not prev:
        problems.append(
            f"tail sentinel's prev is {getattr(tail.prev_free_block, 'block_id', None)}, "
            f"expected {prev.block_id}"
        )
    if len(order) != queue.num_free_blocks:
        problems.append(
            f"num_free_blocks is {queue.num_free_blocks} but the queue holds {len(order)} blocks"
        )
    return order


def check_invariants(pool: BlockPool) -> None:
    """Raise InvariantError if ``pool`` is inconsistent; O(num_gpu_blocks)."""
    problems: list[str] = []
    order = _walk_queue(pool, problems)
    in_queue = bytearray(len(pool.blocks))
    for b in order:
        in_queue[b.block_id] = 1

    null = pool.null_block
    if null is not pool.blocks[0] or not null.is_null:
        problems.append("the null block must be block 0 with is_null set")
    if null.block_hash is not None:
        problems.append("the null block has a hash")

    for i, b in enumerate(pool.blocks):
        if b.block_id != i:
            problems.append(f"blocks[{i}] has block_id {b.block_id}")
        if b.is_null:
            if i != 0:
                problems.append(f"block {i} is marked null")
            if in_queue[i]:
                problems.append("the null block is in the free queue")
            continue
        if in_queue[i]:
            if b.ref_cnt != 0:
                problems.append(f"free block {i} has ref_cnt {b.ref_cnt}")
        else:
            if b.ref_cnt <= 0:
                problems.append(f"block {i} is out of the queue with ref_cnt {b.ref_cnt}")
            if b.prev_free_block is not None or b.next_free_block is not None:
                problems.append(f"held block {i} still has queue links")
        key = b.block_hash
        if key is not None and i not in in_map(pool, key):
            problems.append(f"block {i} has hash {key.hex()[:16]}… but the map does not hold it")

    mapped = 0
    for mkey, entry in pool.cached_block_hash_to_block._cache.items():
        if isinstance(entry, dict):
            if not entry:
                problems.append(f"key {mkey.hex()[:16]}… maps to an empty dict")
            items = list(entry.items())
        else:
            items = [(entry.block_id, entry)]
        for bid, b in items:
            mapped += 1
            if not isinstance(b, KVCacheBlock) or b.block_id != bid:
                problems.append(f"key {mkey.hex()[:16]}… files {b!r} under id {bid}")
                continue
            if not (0 <= bid < len(pool.blocks)) or pool.blocks[bid] is not b:
                problems.append(f"the map holds block {bid} which is not of this pool")
            elif b.is_null:
                problems.append("the null block is in the hash map")
            elif b.block_hash != mkey:
                problems.append(f"block {bid} is filed under a key that is not its hash")
    if problems:
        raise InvariantError(problems, _dump(pool, order))


def in_map(pool: BlockPool, key: bytes) -> frozenset[int]:
    """The ids of the blocks the map files under ``key``."""
    entry = pool.cached_block_hash_to_block._cache.get(key)
    if entry is None:
        return frozenset()
    if isinstance(entry, dict):
        return frozenset(entry)
    return frozenset((entry.block_id,))


def check_coordinator(coordinator: KVCacheCoordinator) -> None:
    """Raise InvariantError if the block tables of ``coordinator`` disagree
    with its pool, which it must be the only user of: every block's ref
    count is the number of table slots holding it (so no table holds a free
    block, and no block is held that no table names), a table holds the null
    block only left of its real blocks' window (a sliding-window group) and
    never in a full-attention group; then the pool's own invariants."""
    pool = coordinator.pool
    problems: list[str] = []
    held = [0] * len(pool.blocks)
    for g, spec in enumerate(coordinator.specs):
        for rid, table in coordinator.groups[g].tables.items():
            for i, b in enumerate(table):
                if b.is_null:
                    if spec.is_full:
                        problems.append(f"{rid}: full-attention group {g} holds the null block")
                    elif i and not table[i - 1].is_null:
                        problems.append(f"{rid}: group {g} has a null block after a real one")
                    continue
                if not (0 <= b.block_id < len(pool.blocks)) or pool.blocks[b.block_id] is not b:
                    problems.append(f"{rid}: group {g} holds block {b.block_id} of another pool")
                    continue
                held[b.block_id] += 1
    problems.extend(
        f"block {b.block_id} has ref_cnt {b.ref_cnt} but {held[b.block_id]} table slot(s)"
        for b in pool.blocks
        if not b.is_null and b.ref_cnt != held[b.block_id]
    )
    if problems:
        raise InvariantError(problems, _dump(pool, pool.free_block_queue.get_all_free_blocks()))
    check_invariants(pool)
