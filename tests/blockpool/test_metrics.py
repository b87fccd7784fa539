"""KVCacheMetricsCollector and BlockMetricsState, with an injected clock/rng."""

from __future__ import annotations

import math
import random
import time

import pytest

from blockpool import (
    BlockMetricsState,
    BlockPool,
    KVCacheBlock,
    KVCacheEvictionEvent,
    KVCacheMetricsCollector,
    PoolAssertionError,
    Request,
    check_invariants,
    get_request_block_hasher,
    sha256,
)

S = 1_000_000_000  # ns per second


class Clock:
    """A settable monotonic clock in nanoseconds."""

    def __init__(self, now: int = 0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = int(seconds * S)


class Rng:
    """Hands out the given numbers in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.values.pop(0)


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.0000001, 2, math.nan, math.inf])
def test_sample_rate_outside_0_1_is_refused(bad: float) -> None:
    with pytest.raises(PoolAssertionError, match="sample_rate must be in"):
        KVCacheMetricsCollector(bad)


def test_sample_rate_bounds_and_default() -> None:
    assert KVCacheMetricsCollector().sample_rate == 0.01
    assert KVCacheMetricsCollector(1.0).sample_rate == 1.0
    assert KVCacheMetricsCollector(1e-9).sample_rate == 1e-9


def test_sampling_is_random_below_rate() -> None:
    mc = KVCacheMetricsCollector(0.5, rng=Rng([0.49, 0.5, 0.99, 0.0]))
    assert [mc.should_sample_block() for _ in range(4)] == [True, False, False, True]


def test_default_rng_and_clock_are_looked_up_at_call_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mc = KVCacheMetricsCollector(0.5)
    monkeypatch.setattr(random, "random", lambda: 0.4)
    monkeypatch.setattr(time, "monotonic_ns", lambda: 5 * S)
    mc.on_block_allocated(KVCacheBlock(3))
    assert mc.block_metrics[3].birth_time_ns == 5 * S
    monkeypatch.setattr(random, "random", lambda: 0.6)
    mc.on_block_allocated(KVCacheBlock(4))
    assert list(mc.block_metrics) == [3]
    monkeypatch.setattr(time, "monotonic_ns", lambda: 8 * S)
    mc.on_block_evicted(KVCacheBlock(3))
    assert mc.drain_events() == [KVCacheEvictionEvent(3.0, 3.0, ())]


def test_block_state_lifetime_idle_and_gaps() -> None:
    clock = Clock(10 * S)
    st = BlockMetricsState(clock)
    assert (st.birth_time_ns, st.last_access_ns, list(st.access_history)) == (10 * S, 10 * S, [])
    assert st.get_reuse_gaps_seconds() == []
    clock.at(12)
    st.record_access()
    assert st.get_reuse_gaps_seconds() == []  # one access: no gap yet
    for t in (12.5, 14, 17, 17.25):
        clock.at(t)
        st.record_access()
    # The last four accesses are kept: 12.5, 14, 17, 17.25.
    assert list(st.access_history) == [int(t * S) for t in (12.5, 14, 17, 17.25)]
    assert st.get_reuse_gaps_seconds() == [1.5, 3.0, 0.25]
    clock.at(20)
    assert st.get_lifetime_seconds() == 10.0
    assert st.get_idle_time_seconds() == 2.75
    assert st.last_access_ns == int(17.25 * S)


def test_pool_reports_lifetime_idle_and_gaps_on_reallocation() -> None:
    clock = Clock()
    mc = KVCacheMetricsCollector(1.0, clock=clock)
    pool = BlockPool(3, enable_caching=True, hash_block_size=2, metrics_collector=mc)
    clock.at(1)
    (a, b) = pool.get_new_blocks(2)
    assert {k: v.birth_time_ns for k, v in mc.block_metrics.items()} == {1: S, 2: S}
    clock.at(3)
    pool.touch([a])
    clock.at(4)
    pool.touch([a])
    pool.free_blocks([a, a, a, b])  # queue: 1, 2
    assert mc.drain_events() == []  # freeing is not evicting
    clock.at(10)
    pool.get_new_blocks(1)  # re-allocating block 1 ends its sampled life
    assert mc.drain_events() == [
        KVCacheEvictionEvent(lifetime_seconds=9.0, idle_seconds=6.0, reuse_gaps_seconds=(1.0,))
    ]
    assert mc.block_metrics[1].birth_time_ns == 10 * S  # sampled anew
    clock.at(11)
    pool.get_new_blocks(1)  # block 2: never accessed
    assert mc.drain_events() == [KVCacheEvictionEvent(10.0, 10.0, ())]
    assert sorted(mc.block_metrics) == [1, 2]
    check_invariants(pool)


def test_only_sampled_blocks_are_tracked() -> None:
    clock = Clock()
    # random() < rate samples: exactly the rate does not.
    mc = KVCacheMetricsCollector(0.5, clock=clock, rng=Rng([0.1, 0.5, 0.2]))
    pool = BlockPool(5, enable_caching=False, hash_block_size=2, metrics_collector=mc)
    got = pool.get_new_blocks(3)
    assert sorted(mc.block_metrics) == [1, 3]
    pool.touch(got)
    assert [len(mc.block_metrics[i].access_history) for i in (1, 3)] == [1, 1]
    pool.free_blocks(got)
    pool.free_blocks(got)
    check_invariants(pool)


def test_eviction_is_reported_first_and_always_even_for_held_blocks() -> None:
    # evict_blocks on a held, unhashed block still ends its sampled life.
    clock = Clock()
    mc = KVCacheMetricsCollector(1.0, clock=clock)
    pool = BlockPool(4, enable_caching=True, hash_block_size=2, metrics_collector=mc)
    pool.get_new_blocks(2)
    clock.at(2)
    pool.evict_blocks([2, 3])  # 3 was never allocated: no state, no sample
    assert mc.drain_events() == [KVCacheEvictionEvent(2.0, 2.0, ())]
    assert list(mc.block_metrics) == [1]
    assert [b.ref_cnt for b in pool.blocks] == [0, 1, 1, 0]
    check_invariants(pool)


def test_reset_drops_states_and_undrained_samples() -> None:
    clock = Clock()
    mc = KVCacheMetricsCollector(1.0, clock=clock)
    pool = BlockPool(4, enable_caching=True, hash_block_size=2, metrics_collector=mc)
    blocks = pool.get_new_blocks(3)
    pool.evict_blocks([1])
    assert len(mc._eviction_events) == 1 and sorted(mc.block_metrics) == [2, 3]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert mc.block_metrics == {} and mc.drain_events() == []
    check_invariants(pool)


def test_drain_swaps_the_list_out() -> None:
    mc = KVCacheMetricsCollector(1.0, clock=Clock())
    mc.on_block_allocated(KVCacheBlock(1))
    mc.on_block_evicted(KVCacheBlock(1))
    mc.on_block_evicted(KVCacheBlock(1))  # already gone: nothing
    first = mc.drain_events()
    assert first == [KVCacheEvictionEvent(0.0, 0.0, ())]
    assert mc.drain_events() == []
    mc.on_block_accessed(KVCacheBlock(5))  # untracked: ignored
    assert mc.block_metrics == {}


def test_touch_and_cache_hits_record_accesses() -> None:
    clock = Clock()
    mc = KVCacheMetricsCollector(1.0, clock=clock)
    pool = BlockPool(6, enable_caching=True, hash_block_size=2, metrics_collector=mc)
    req = Request("a", [1, 2, 3, 4], block_hasher=get_request_block_hasher(2, sha256))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, 2, 0)
    pool.free_blocks(reversed(blocks))
    for t in (1, 2, 4, 8, 16):
        clock.at(t)
        hit = pool.get_cached_block(req.block_hashes[0], [0])
        assert hit == [blocks[0]]
        pool.touch(hit)
        pool.free_blocks(hit)
    assert pool.get_cached_block(req.block_hashes[0], [0]) == [blocks[0]]
    state = mc.block_metrics[1]
    assert list(state.access_history) == [2 * S, 4 * S, 8 * S, 16 * S]
    assert state.get_reuse_gaps_seconds() == [2.0, 4.0, 8.0]
    assert list(mc.block_metrics[2].access_history) == []
    clock.at(20)
    pool.evict_blocks([1])
    assert mc.drain_events() == [KVCacheEvictionEvent(20.0, 4.0, (2.0, 4.0, 8.0))]
    check_invariants(pool)
