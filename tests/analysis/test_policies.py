"""Free-order policies and shadow pools: exact orders, scan resistance."""

from __future__ import annotations

import pytest

from blockpool.analysis.feeder import shadow_specs
from blockpool.core.free_order import FREE_ORDERS
from blockpool.shadow import (
    POLICY_NAMES,
    S3FIFO,
    AppendAll,
    ShadowPool,
    ShadowSpec,
    UncachedFirst,
    make_policy,
    make_shadow,
    policy_name,
)

BS = 4


def h(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8  # a 32-byte stand-in hash


def bound(policy: str, capacity: int) -> tuple[ShadowPool, list[bytes | None]]:
    pool = ShadowPool(capacity, make_policy(policy), BS)
    return pool, pool.keys


def test_append_all_keeps_the_given_order() -> None:
    p = AppendAll()
    keys: list[bytes | None] = [None] * 7
    p.bind(6, keys)
    assert p.order() == [1, 2, 3, 4, 5, 6]
    assert p.victims(3) == [1, 2, 3]
    keys[2] = h(2)
    p.release([3, 2, 1])  # a request frees its blocks in reverse
    assert p.order() == [4, 5, 6, 3, 2, 1]
    p.take(6)  # a prefix hit on a free block
    assert p.order() == [4, 5, 3, 2, 1] and p.num_free == 5
    p.check()


def test_uncached_first_prepends_hashless_blocks_in_order() -> None:
    """Later vLLM's free_blocks: blocks without a hash go to the front
    (prepend_n keeps their order: the first listed becomes the head), cached
    ones to the tail."""
    p = UncachedFirst()
    keys: list[bytes | None] = [None] * 9
    p.bind(8, keys)
    assert p.victims(5) == [1, 2, 3, 4, 5]
    keys[1] = h(1)
    keys[4] = h(4)
    p.release([1, 2, 3, 4, 5])  # 2, 3, 5 have no hash
    assert p.order() == [2, 3, 5, 6, 7, 8, 1, 4]
    assert p.victims(3) == [2, 3, 5]  # spent before any cached block
    p.check()


def test_append_all_puts_hashless_blocks_behind_older_cached_ones() -> None:
    p = AppendAll()
    keys: list[bytes | None] = [None] * 5
    p.bind(4, keys)
    p.victims(4)
    keys[1] = h(1)
    p.release([1])
    p.release([2, 3, 4])  # hashless, freed later: reused after the cached block 1
    assert p.victims(1) == [1]


def _request(pool: ShadowPool, rid: str, key: int) -> int:
    """One full hashed block (plus one token): hit or miss, then finish."""
    hit = pool.admit(rid, [h(key)], BS + 1)
    pool.finish(rid)
    pool.check()
    return hit


@pytest.mark.parametrize("policy", ["append_all", "uncached_first", "s3fifo"])
def test_scan(policy: str) -> None:
    """A working set used again and again, then a one-time scan larger than
    the pool, then the working set again: S3-FIFO keeps it, LRU orders lose it."""
    pool = make_shadow(policy, 40, BS)
    working = list(range(10))
    for _ in range(3):
        for k in working:
            _request(pool, f"w{k}", k)
    for k in range(1000, 1200):
        _request(pool, f"s{k}", k)
    hits = sum(_request(pool, f"again{k}", k) for k in working)
    if policy == "s3fifo":
        assert hits == 10
        assert isinstance(pool.policy, S3FIFO) and pool.policy.promoted > 0
    else:
        assert hits == 0


def test_s3fifo_ghost_hit_goes_to_main() -> None:
    pool = make_shadow("s3fifo", 20, BS)
    _request(pool, "a", 1)
    for k in range(100, 125):  # push key 1 out of the small queue into the ghost
        _request(pool, f"s{k}", k)
    assert isinstance(pool.policy, S3FIFO)
    assert h(1) in pool.policy.ghost
    assert _request(pool, "b", 1) == 0  # missed, recomputed...
    assert pool.policy.ghost_hits == 1  # ...and filed in the main queue
    pool.check()


def test_shadow_refuses_and_preempts_what_does_not_fit() -> None:
    pool = make_shadow("append_all", 3, BS)
    assert pool.admit("big", [h(1), h(2), h(3), h(4)], 4 * BS) == -1
    assert pool.stats.refused == 1 and pool.stats.refused_tokens == 16
    assert pool.admit("a", [h(1)], BS) == 0  # one block
    assert pool.admit("b", [h(2)], BS + 1) == 0  # two blocks: the pool is full
    assert not pool.append("a", 2 * BS, [])  # a cannot grow: preempted (freed)
    assert pool.stats.preempted == 1 and "a" not in pool.requests
    assert not pool.append("ghost", 5, [])  # unknown: ignored
    assert pool.finish("b") and not pool.finish("b")
    pool.check()
    assert pool.stats.hit_rate == 0.0


def test_reset_drops_every_hash() -> None:
    pool = make_shadow("s3fifo", 8, BS)
    _request(pool, "a", 1)
    pool.admit("held", [h(9)], BS)
    assert not pool.reset()  # a block is held
    pool.finish("held")
    assert pool.reset()
    assert pool.cached_blocks() == 0 and pool.map == {}
    pool.check()
    assert _request(pool, "b", 1) == 0


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match=r"unknown shadow policy 'lru-k' \(one of append_all, "):
        make_policy("lru-k")


def test_policy_names_are_the_free_orders_plus_s3fifo() -> None:
    assert (*FREE_ORDERS, "s3fifo") == POLICY_NAMES
    assert [make_policy(n).name for n in POLICY_NAMES] == list(POLICY_NAMES)


def test_old_spelling_vllm016_is_append_all() -> None:
    assert policy_name("vllm016") == "append_all"
    assert type(make_policy("vllm016")) is AppendAll
    shadow = make_shadow("vllm016", 3, BS)
    assert shadow.name == "append_all@1x"
    assert shadow_specs(["vllm016", "s3fifo"], [2.0], grid=False) == [
        ShadowSpec("append_all", 1.0),
        ShadowSpec("append_all", 2.0),
        ShadowSpec("s3fifo", 1.0),
    ]


def test_settings_take_the_old_spelling_and_refuse_unknown_policies() -> None:
    from pydantic import ValidationError

    from app.shared.settings import Settings

    assert Settings(shadow_policies=["vllm016", "s3fifo"]).shadow_policies == [
        "append_all",
        "s3fifo",
    ]
    with pytest.raises(ValidationError, match="unknown shadow policy 'lru'"):
        Settings(shadow_policies=["lru"])
