"""ShadowPool: a metadata-only pool driven by request-level accesses.

It replays what RequestManager does to a BlockPool -- prefix lookup from the
left (stopping at the first miss, never counting the block of the last
prompt token), touch the hits, allocate the rest, cache the full blocks, grow
with decode tokens, free in reverse -- over plain int slots, with a
pluggable free-order policy (``policies.py``) and its own hit accounting.  No
events, no metrics collector, no tensors.

With the ``append_all`` policy and ``capacity == num_gpu_blocks - 1`` it makes
the same decisions as the real pool for the same request stream: the same
hits, the same evictions, even the same block ids (slot ``i`` is block
``i``).  At other capacities or under other policies it answers "what if".

When a request does not fit (a smaller shadow), it is refused and counted
(its tokens count as queried, none as hit); a request that cannot grow is
preempted (freed) and counted.  Accesses for requests the shadow does not
hold are ignored.

Complexity: admit O(blocks), append O(new blocks), finish O(blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from blockpool.core.admission import cdiv as _cdiv
from blockpool.core.admission import fits, hit_limit, new_blocks
from blockpool.shadow.free_policy import FreePolicy
from blockpool.shadow.policies import make_policy, policy_name


@dataclass
class ShadowStats:
    """Counters of one shadow pool (tokens unless named blocks)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    query_blocks: int = 0
    hit_blocks: int = 0
    refused: int = 0
    refused_tokens: int = 0
    preempted: int = 0
    evictions: int = 0
    stored_blocks: int = 0
    resets: int = 0

    @property
    def hit_rate(self) -> float:
        """Hit tokens over queried tokens, refused requests counting as misses."""
        total = self.queries + self.refused_tokens
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["hit_rate"] = self.hit_rate
        return out


@dataclass
class _Req:
    tables: list[list[int]]
    hashes: list[bytes]
    num_tokens: int
    num_cached: int


@dataclass
class ShadowPool:
    """One simulated pool of ``capacity`` usable blocks (the null block aside)."""

    capacity: int
    policy: FreePolicy
    block_size: int
    num_groups: int = 1
    name: str = ""
    factor: float = 1.0
    stats: ShadowStats = field(default_factory=ShadowStats)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("a shadow pool needs at least one block")
        if self.block_size < 1 or self.num_groups < 1:
            raise ValueError("block_size and num_groups must be positive")
        self.keys: list[bytes | None] = [None] * (self.capacity + 1)
        self.ref = [0] * (self.capacity + 1)
        self.map: dict[bytes, Any] = {}  # key -> slot, or list of slots (first = oldest)
        self.requests: dict[str, _Req] = {}
        self.policy.bind(self.capacity, self.keys)
        self._suffix = [g.to_bytes(4, "big") for g in range(self.num_groups)]
        if not self.name:
            self.name = f"{self.policy.name}@{self.capacity}"

    # ------------------------------------------------------------- helpers

    def _key(self, h: bytes, g: int) -> bytes:
        return h if g == 0 else h + self._suffix[g]

    def _lookup(self, key: bytes) -> int:
        entry = self.map.get(key)
        if entry is None:
            return 0
        return entry if entry.__class__ is int else entry[0]

    def _allocate(self, n: int) -> list[int]:
        """``n`` slots from the policy, their hashes evicted, ref count 1."""
        slots = self.policy.victims(n)
        keys, ref, cache = self.keys, self.ref, self.map
        for slot in slots:
            key = keys[slot]
            if key is not None:
                entry = cache[key]
                if entry.__class__ is int:
                    del cache[key]
                else:
                    entry.remove(slot)  # a list stays a list, as vLLM keeps its dict
                    if not entry:
                        del cache[key]
                keys[slot] = None
                self.stats.evictions += 1
            ref[slot] = 1
        return slots

    def _cache(
        self, table: list[int], hashes: Sequence[bytes], start: int, end: int, g: int
    ) -> None:
        keys, cache = self.keys, self.map
        for i in range(start, end):
            slot = table[i]
            key = self._key(hashes[i], g)
            keys[slot] = key
            entry = cache.get(key)
            if entry is None:
                cache[key] = slot
            elif entry.__class__ is int:
                cache[key] = [entry, slot]
            else:
                entry.append(slot)
        self.stats.stored_blocks += max(0, end - start)

    def _free(self, table: list[int]) -> None:
        ref = self.ref
        zero = []
        for slot in reversed(table):
            r = ref[slot] - 1
            ref[slot] = r
            if r == 0:
                zero.append(slot)
        if zero:
            self.policy.release(zero)

    # ------------------------------------------------------------ accesses

    def admit(self, rid: str, hashes: Sequence[bytes], num_tokens: int) -> int:
        """A request with ``num_tokens`` prompt tokens and the hashes of its
        full blocks.  Returns its hit blocks, or -1 when it does not fit."""
        if rid in self.requests:
            self.finish(rid)
        bs, groups = self.block_size, self.num_groups
        max_hit = hit_limit(num_tokens, bs, len(hashes))
        hits: list[list[int]] = [[] for _ in range(groups)]
        cache = self.map
        if groups == 1:
            row = hits[0]
            for i in range(max_hit):
                entry = cache.get(hashes[i])
                if entry is None:
                    break
                row.append(entry if entry.__class__ is int else entry[0])
        else:
            for i in range(max_hit):
                found = [self._lookup(self._key(hashes[i], g)) for g in range(groups)]
                if not all(found):
                    break
                for row, slot in zip(hits, found, strict=True):
                    row.append(slot)
        num_hit = len(hits[0])
        num_new = new_blocks(num_tokens, bs, num_hit)
        ref = self.ref
        evictable = {s for row in hits for s in row if ref[s] == 0}
        stats = self.stats
        if not fits(num_new, groups, len(evictable), self.policy.num_free):
            stats.refused += 1
            stats.refused_tokens += num_tokens
            return -1
        policy = self.policy
        for row in hits:
            for slot in row:
                if ref[slot] == 0:
                    policy.take(slot)
                ref[slot] += 1
                policy.hit(slot)
        tables = [row + self._allocate(num_new) for row in hits]
        num_full = num_tokens // bs
        for g, table in enumerate(tables):
            self._cache(table, hashes, num_hit, num_full, g)
        self.requests[rid] = _Req(
            tables, list(hashes[:num_full]), num_tokens, max(num_full, num_hit)
        )
        stats.requests += 1
        stats.queries += num_tokens
        stats.hits += num_hit * bs
        stats.query_blocks += _cdiv(num_tokens, bs)
        stats.hit_blocks += num_hit
        return num_hit

    def append(self, rid: str, num_tokens: int, new_hashes: Sequence[bytes]) -> bool:
        """The request now has ``num_tokens`` tokens; ``new_hashes`` are the
        hashes of the blocks that became full.  False when it was preempted
        (or is unknown)."""
        req = self.requests.get(rid)
        if req is None:
            return False
        bs = self.block_size
        need = _cdiv(num_tokens, bs) - len(req.tables[0])
        if need > 0:
            if need * self.num_groups > self.policy.num_free:
                self.finish(rid)
                self.stats.preempted += 1
                return False
            for table in req.tables:
                table.extend(self._allocate(need))
        req.num_tokens = num_tokens
        req.hashes.extend(new_hashes)
        num_full = num_tokens // bs
        if num_full > req.num_cached:
            end = min(num_full, len(req.hashes))
            for g, table in enumerate(req.tables):
                self._cache(table, req.hashes, req.num_cached, end, g)
            req.num_cached = end
        return True

    def finish(self, rid: str) -> bool:
        """Free the request's blocks, each group's in reverse."""
        req = self.requests.pop(rid, None)
        if req is None:
            return False
        for table in req.tables:
            self._free(table)
        return True

    def reset(self) -> bool:
        """Drop every hash (refused, False, while a block is held)."""
        if self.requests:
            return False
        keys = self.keys
        for slot in range(1, self.capacity + 1):
            keys[slot] = None
        self.map.clear()
        self.policy.cleared()
        self.stats.resets += 1
        return True

    # --------------------------------------------------------------- reads

    @property
    def num_free(self) -> int:
        return self.policy.num_free

    def cached_blocks(self) -> int:
        return sum(1 for k in self.keys if k is not None)

    def check(self) -> None:
        """O(capacity) audit: ref counts vs the requests held, the map vs
        the slots' hashes, free slots vs the policy."""
        held = [0] * (self.capacity + 1)
        for req in self.requests.values():
            for table in req.tables:
                for slot in table:
                    held[slot] += 1
        assert held[1:] == self.ref[1:], "ref counts disagree with the requests"
        free = self.policy.order()
        assert sorted(free) == [s for s in range(1, self.capacity + 1) if self.ref[s] == 0]
        assert len(free) == self.policy.num_free
        filed = 0
        for key, entry in self.map.items():
            slots = [entry] if entry.__class__ is int else entry
            for slot in slots:
                assert self.keys[slot] == key, f"slot {slot} not filed under its hash"
                filed += 1
        assert filed == sum(1 for k in self.keys if k is not None), "hashed slots vs the map"
        self.policy.check()


def make_shadow(
    policy: str, capacity: int, block_size: int, num_groups: int = 1, factor: float = 1.0
) -> ShadowPool:
    """A shadow pool by policy name (``POLICY_NAMES``, or an old spelling)."""
    policy = policy_name(policy)
    return ShadowPool(
        capacity,
        make_policy(policy),
        block_size,
        num_groups,
        name=f"{policy}@{factor:g}x",
        factor=factor,
    )
