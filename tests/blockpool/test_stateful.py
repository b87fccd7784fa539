"""A Hypothesis state machine drives a BlockPool and a tiny reference model.

The model is deliberately naive: the free queue is a Python list, ref counts
and hashes are lists, the hash map is a dict of key -> (kind, [block ids]),
events and metrics samples are lists.  After every step the pool must agree
with it exactly (queue order, ref counts, hashes, map contents including the
single/dict form, pending events, metric states) and pass check_invariants.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from blockpool import (
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVCacheBlock,
    KVCacheEvictionEvent,
    KVCacheMetricsCollector,
    LoRARequest,
    Request,
    check_invariants,
    get_request_block_hasher,
    sha256,
)

BS = 2
HASHER = get_request_block_hasher(BS, sha256)
# Documents that share prefixes, so different holders hash alike.
_BASE = list(range(1, 33))
DOCS = [_BASE, _BASE[:4] + list(range(50, 78)), _BASE[:8] + list(range(80, 104)), [7] * 32]
LORAS = [None, None, None, LoRARequest("adapter-x", 3)]
GROUPS = [0, 0, 1]
STEPS = [0]
SEEN: Counter[str] = Counter()  # what the runs exercised, checked at the end


@dataclass
class Holding:
    """What a fake request holds: a block table and the request it caches for."""

    table: list[KVCacheBlock]
    request: Request
    num_cached: int
    group: int


def as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


class PoolMachine(RuleBasedStateMachine):
    @initialize(
        n=st.integers(1, 14),
        rate=st.sampled_from([1.0, 0.5]),
        seed=st.integers(0, 2**16),
    )
    def setup(self, n: int, rate: float, seed: int) -> None:
        self.now = 0
        self.rate = rate
        self.mc = KVCacheMetricsCollector(
            rate, clock=lambda: self.now, rng=random.Random(seed).random
        )
        self.pool = BlockPool(
            n, enable_caching=True, hash_block_size=BS, enable_kv_cache_events=True,
            metrics_collector=self.mc,
        )  # fmt: skip
        # ----- the reference model
        self.n = n
        self.model_rng = random.Random(seed)
        self.free: list[int] = list(range(1, n))
        self.ref = [0] * n
        self.hash: list[bytes | None] = [None] * n
        self.cache: dict[bytes, tuple[str, list[int]]] = {}
        self.events: list[Any] = []
        self.metrics: dict[int, tuple[int, int, deque[int]]] = {}
        self.samples: list[KVCacheEvictionEvent] = []
        self.holdings: list[Holding] = []

    # ------------------------------------------------------------ model ops

    def _tick(self) -> None:
        STEPS[0] += 1
        self.now += 1_000_000  # 1 ms per step

    def _m_sample(self, bid: int) -> None:
        state = self.metrics.pop(bid, None)
        if state is not None:
            birth, last, hist = state
            h = list(hist)
            SEEN["metrics sample" + (" with gaps" if len(h) > 1 else "")] += 1
            self.samples.append(
                KVCacheEvictionEvent(
                    (self.now - birth) / 1e9,
                    (self.now - last) / 1e9,
                    tuple((h[i] - h[i - 1]) / 1e9 for i in range(1, len(h))),
                )
            )

    def _m_evict(self, bid: int) -> None:
        self._m_sample(bid)
        key = self.hash[bid]
        if key is None:
            return
        entry = self.cache.get(key)
        if entry is None or bid not in entry[1]:
            return
        entry[1].remove(bid)
        if not entry[1]:
            del self.cache[key]
        self.hash[bid] = None
        self.events.append(BlockRemoved([as_int(key[:-4])], "GPU"))
        SEEN["evicted a cached block"] += 1
        if entry[1]:
            SEEN["evicted one of several copies"] += 1

    def _m_access(self, bid: int) -> None:
        if bid in self.metrics:
            birth, _, hist = self.metrics[bid]
            hist.append(self.now)
            self.metrics[bid] = (birth, self.now, hist)

    def _m_touch(self, blocks: list[KVCacheBlock]) -> None:
        for b in blocks:
            bid = b.block_id
            if bid == 0:
                continue  # the null block: never queued, count not kept
            if self.ref[bid] == 0:
                self.free.remove(bid)
            self.ref[bid] += 1
            self._m_access(bid)

    def _m_free(self, blocks: list[KVCacheBlock]) -> None:
        """A block whose last reference goes joins the free queue's tail."""
        for b in blocks:
            bid = b.block_id
            if bid == 0:
                continue
            self.ref[bid] -= 1
            if self.ref[bid] == 0:
                self.free.append(bid)

    # ---------------------------------------------------------------- rules

    def _allocate(self, n: int) -> list[KVCacheBlock]:
        got = self.pool.get_new_blocks(n)
        expected = self.free[:n]
        assert [b.block_id for b in got] == expected
        del self.free[:n]
        for bid in expected:
            self._m_evict(bid)
            assert self.ref[bid] == 0
            self.ref[bid] = 1
            if self.model_rng.random() < self.rate:
                self.metrics[bid] = (self.now, self.now, deque(maxlen=4))
        return got

    def _hold(self, data: st.DataObject, n: int, groups: list[int]) -> list[Holding]:
        """Allocate ``n`` blocks per group for one new request."""
        with_null = data.draw(st.booleans(), label="null first")
        doc = DOCS[data.draw(st.integers(0, len(DOCS) - 1), label="doc")]
        ntok = (n + with_null) * BS - data.draw(st.integers(0, 1), label="partial")
        lora = data.draw(st.sampled_from(LORAS), label="lora")
        request = Request("h", doc[:ntok], block_hasher=HASHER, lora_request=lora)
        out = []
        for g in groups:
            got = self._allocate(n)
            table = [self.pool.null_block, *got] if with_null else got
            out.append(Holding(table, request, 0, g))
        self.holdings += out
        return out

    def _cache(self, h: Holding, upto: int) -> None:
        self.pool.cache_full_blocks(h.request, h.table, h.num_cached, upto, BS, h.group)
        if upto <= h.num_cached:
            return  # nothing new: no event
        hashes = h.request.block_hashes
        suffix = h.group.to_bytes(4, "big")
        stored = []
        for i in range(h.num_cached, upto):
            bid = h.table[i].block_id
            if bid == 0:
                SEEN["null block skipped"] += 1
                continue
            key = hashes[i] + suffix
            assert self.hash[bid] is None
            self.hash[bid] = key
            if key in self.cache:
                SEEN["duplicate under one key"] += 1
                self.cache[key] = ("dict", [*self.cache[key][1], bid])
            else:
                self.cache[key] = ("one", [bid])
            stored.append(as_int(hashes[i]))
        lora = h.request.lora_request
        self.events.append(
            BlockStored(
                stored,
                None if h.num_cached == 0 else as_int(hashes[h.num_cached - 1]),
                h.request.all_token_ids[h.num_cached * BS : upto * BS],
                BS,
                lora.adapter_id if lora else None,
                "GPU",
                lora.name if lora else None,
            )
        )
        h.num_cached = upto

    @rule(data=st.data())
    def get_new_blocks(self, data: st.DataObject) -> None:
        self._tick()
        n = data.draw(st.integers(0, len(self.free) + 1), label="n")
        if n > len(self.free):
            with pytest.raises(ValueError, match=f"^Cannot get {n} free blocks from the pool$"):
                self.pool.get_new_blocks(n)
            return
        if n == 0:
            assert self._allocate(0) == []
        else:
            self._hold(data, n, [data.draw(st.sampled_from(GROUPS), label="group")])

    @precondition(lambda self: bool(self.free))
    @rule(data=st.data())
    def admit_and_cache(self, data: st.DataObject) -> None:
        """get_new_blocks then cache_full_blocks for every full block, as a
        request that computed its whole prompt, in one or two KV-cache
        groups (duplicates arise here)."""
        self._tick()
        groups = data.draw(st.sampled_from([[0], [1], [0, 1]]), label="groups")
        if len(self.free) < len(groups):
            groups = groups[:1]
        n = data.draw(st.integers(1, min(len(self.free) // len(groups), 6)), label="n")
        for h in self._hold(data, n, groups):
            self._cache(h, len(h.request.block_hashes))

    @precondition(
        lambda self: any(h.num_cached < len(h.request.block_hashes) for h in self.holdings)
    )
    @rule(data=st.data())
    def cache_full_blocks(self, data: st.DataObject) -> None:
        self._tick()
        candidates = [h for h in self.holdings if h.num_cached < len(h.request.block_hashes)]
        h = data.draw(st.sampled_from(candidates), label="holding")
        upto = data.draw(st.integers(h.num_cached, len(h.request.block_hashes)), label="upto")
        self._cache(h, upto)

    @precondition(lambda self: bool(self.holdings))
    @rule(data=st.data())
    def free_blocks(self, data: st.DataObject) -> None:
        self._tick()
        i = data.draw(st.integers(0, len(self.holdings) - 1), label="holding")
        h = self.holdings.pop(i)
        how = data.draw(st.sampled_from(["reverse", "forward", "shuffle"]), label="order")
        if how == "reverse":
            ordered = h.table[::-1]
        elif how == "forward":
            ordered = list(h.table)
        else:
            ordered = data.draw(st.permutations(h.table), label="permutation")
        self.pool.free_blocks(iter(ordered))
        self._m_free(ordered)

    @precondition(lambda self: len(self.holdings) > 1)
    @rule()
    def finish_everything(self) -> None:
        """Every holder finishes (in reverse, as requests do): the pool drains,
        so that resets are accepted often enough to be exercised."""
        self._tick()
        while self.holdings:
            h = self.holdings.pop()
            ordered = h.table[::-1]
            self.pool.free_blocks(ordered)
            self._m_free(ordered)

    @rule(data=st.data())
    def touch_cache_hits(self, data: st.DataObject) -> None:
        """A prefix lookup as a scheduler does it: hits until the first miss."""
        self._tick()
        doc = DOCS[data.draw(st.integers(0, len(DOCS) - 1), label="doc")]
        lora = data.draw(st.sampled_from(LORAS), label="lora")
        group = data.draw(st.sampled_from(GROUPS), label="group")
        nblocks = data.draw(st.integers(1, 8), label="blocks")
        request = Request("t", doc[: nblocks * BS], block_hasher=HASHER, lora_request=lora)
        hits: list[KVCacheBlock] = []
        for h in request.block_hashes:
            got = self.pool.get_cached_block(h, [group])
            entry = self.cache.get(h + group.to_bytes(4, "big"))
            assert (got is None) == (entry is None)
            if got is None or entry is None:
                break
            assert [b.block_id for b in got] == [entry[1][0]]
            hits += got
            SEEN["cache hit"] += 1
        self.pool.touch(hits)
        self._m_touch(hits)
        if hits:
            held = Request("t", doc[: len(hits) * BS], block_hasher=HASHER, lora_request=lora)
            self.holdings.append(Holding(hits, held, len(hits), group))

    @precondition(lambda self: bool(self.holdings))
    @rule(data=st.data())
    def touch_held_blocks(self, data: st.DataObject) -> None:
        self._tick()
        h = data.draw(st.sampled_from(self.holdings), label="holding")
        picked = data.draw(st.lists(st.sampled_from(h.table), min_size=1, max_size=4))
        self.pool.touch(picked)
        self._m_touch(picked)
        req = Request("x", [], block_hasher=None)
        self.holdings.append(Holding(list(picked), req, len(picked), h.group))

    @rule(data=st.data())
    def get_cached_block(self, data: st.DataObject) -> None:
        """Multi-group lookups are all-or-nothing and change nothing."""
        self._tick()
        if self.cache and data.draw(st.booleans(), label="a cached hash"):
            h = data.draw(st.sampled_from(sorted(self.cache)), label="key")[:-4]
        else:
            doc = DOCS[data.draw(st.integers(0, len(DOCS) - 1), label="doc")]
            lora = data.draw(st.sampled_from(LORAS), label="lora")
            k = data.draw(st.integers(1, 6), label="block")
            h = Request("q", doc[: k * BS], block_hasher=HASHER, lora_request=lora).block_hashes[-1]
        gids = data.draw(st.lists(st.sampled_from([0, 0, 1, 1, 2]), max_size=3), label="groups")
        got = self.pool.get_cached_block(h, gids)
        expected: list[int] | None = []
        for g in gids:
            entry = self.cache.get(h + g.to_bytes(4, "big"))
            if entry is None:
                expected = None
                break
            assert expected is not None
            expected.append(entry[1][0])
        SEEN[f"lookup {'miss' if expected is None else 'hit'} over {len(set(gids))} group(s)"] += 1
        assert (None if got is None else [b.block_id for b in got]) == expected

    @rule(ids=st.lists(st.integers(0, 13), max_size=4))
    def evict_blocks(self, ids: list[int]) -> None:
        self._tick()
        ids = [i for i in ids if i < self.n]
        self.pool.evict_blocks(ids)
        for bid in ids:
            self._m_evict(bid)

    @precondition(lambda self: bool(self.cache) or len(self.free) < self.n - 1)
    @rule()
    def reset_prefix_cache(self) -> None:
        self._tick()
        ok = self.pool.reset_prefix_cache()
        assert ok == (len(self.free) == self.n - 1)
        SEEN[f"reset {'accepted' if ok else 'refused'}"] += 1
        if ok:
            self.cache = {}
            self.hash = [None] * self.n
            self.metrics = {}
            self.samples = []
            self.events.append(AllBlocksCleared())

    @rule()
    def take_events(self) -> None:
        self._tick()
        assert self.pool.take_events() == self.events
        SEEN.update(type(e).__name__ for e in self.events)
        self.events = []
        assert self.pool.kv_event_queue == []

    @rule()
    def drain_metrics(self) -> None:
        self._tick()
        assert self.mc.drain_events() == self.samples
        self.samples = []

    # ------------------------------------------------------------ agreement

    @invariant()
    def agrees_with_the_model(self) -> None:
        pool = self.pool
        check_invariants(pool)
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == self.free
        assert pool.get_num_free_blocks() == len(self.free)
        assert [b.ref_cnt for b in pool.blocks[1:]] == self.ref[1:]
        assert [b.block_hash for b in pool.blocks] == self.hash
        actual = {
            k: ("dict", list(v)) if isinstance(v, dict) else ("one", [v.block_id])
            for k, v in pool.cached_block_hash_to_block._cache.items()
        }
        assert actual == self.cache
        assert pool.kv_event_queue == self.events
        assert {
            bid: (s.birth_time_ns, s.last_access_ns, list(s.access_history))
            for bid, s in self.mc.block_metrics.items()
        } == {bid: (b, last, list(h)) for bid, (b, last, h) in self.metrics.items()}
        assert self.mc._eviction_events == self.samples
        expected_usage = 0 if self.n == 1 else 1.0 - len(self.free) / (self.n - 1)
        assert pool.get_usage() == expected_usage


def test_pool_agrees_with_the_reference_model() -> None:
    STEPS[0] = 0
    SEEN.clear()
    run_state_machine_as_test(PoolMachine)
    current = settings()
    if current.max_examples * current.stateful_step_count >= 10_000:  # the ci profile
        assert STEPS[0] >= 10_000, f"only {STEPS[0]} state-machine steps ran"
        wanted = [
            "evicted a cached block",
            "evicted one of several copies",
            "duplicate under one key",
            "null block skipped",
            "cache hit",
            "lookup hit over 2 group(s)",
            "lookup miss over 2 group(s)",
            "reset accepted",
            "reset refused",
            "metrics sample with gaps",
            "BlockStored",
            "BlockRemoved",
            "AllBlocksCleared",
        ]
        assert [w for w in wanted if SEEN[w] < 3] == [], SEEN
