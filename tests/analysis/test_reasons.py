"""Miss reasons on hand-built scenarios: the exact blocks and reasons.

Pool: 8 blocks (ids 1..7 usable) of 4 tokens.  Every engine is checked at
teardown (pool invariants, the engine's bookkeeping, the shadows)."""

from __future__ import annotations

from collections.abc import Callable

from app.pool.engine import Engine
from tests.analysis.conftest import (
    Clock,
    admit,
    allocate,
    append,
    details,
    evict,
    finish,
    free,
    reasons,
)

A = [11, 12, 13, 14, 15, 16, 17, 18]  # two full blocks
Factory = Callable[..., Engine]


def test_cold_and_partial_tail(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "a", list(range(100, 110)))  # 2 full blocks + 2 tokens
    assert reasons(e, "a") == ["cold", "cold", "block_size_floor"]
    assert details(e, "a")[2] == {"partial": True, "tokens": 2}
    m = e.analysis.misses  # type: ignore[union-attr]
    assert m.totals()["cold"] == {"blocks": 2, "tokens": 8}
    assert m.totals()["block_size_floor"] == {"blocks": 1, "tokens": 2}


def test_last_token_block_is_recomputed(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "a", A)
    finish(e, "a")
    r = admit(e, "b", A)
    assert r["num_hit_blocks"] == 1
    assert reasons(e, "b") == [None, "last_token"]
    # the block is stored again: a duplicate, not a regret
    assert e.analysis.misses.regret.regrets == 0  # type: ignore[union-attr]


def test_evicted_by_reuse_with_its_queue_travel(engine_factory: Factory, clock: Clock) -> None:
    e = engine_factory()
    admit(e, "a", A)  # blocks 1, 2
    finish(e, "a")  # queue: 3 4 5 6 7 2 1 (freed in reverse)
    assert [b.block_id for b in e.pool.free_block_queue] == [3, 4, 5, 6, 7, 2, 1]
    clock.advance(10)
    ids = allocate(e, 6)  # pops 3..7 and 2: block 2's hash (A's second block) goes
    assert ids == [3, 4, 5, 6, 7, 2]
    free(e, ids)
    clock.advance(5)
    admit(e, "b", A)  # block 0 hits (block 1); block 1 was evicted
    assert reasons(e, "b") == [None, "evicted"]
    d = details(e, "b")[1]
    assert d is not None
    assert d["cause"] == "reuse"
    assert d["block_id"] == 2
    assert d["evicted_by"] is None  # the raw block API took it
    assert d["evicted_ago_seconds"] == 5
    assert d["queue_position_when_freed"] == 5  # blocks 3..7 were ahead of it
    assert d["allocations_between"] == 5  # 5 pops before it (3..7); 2 before its free
    assert d["touched_out_ahead"] == 0
    assert d["seconds_in_queue"] == 10
    # stored again 5 s after its eviction: a regret
    m = e.analysis.misses.regret  # type: ignore[union-attr]
    assert m.regrets == 1
    e.tick()
    assert m.regret_gap.count == 1 and m.regret_gap.sum == 5


def test_evict_op_then_chain_broken(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=12)
    toks = list(range(40, 52))  # 3 full blocks: the last is the last-token block
    admit(e, "a", toks)  # blocks 1, 2, 3
    finish(e, "a")
    assert evict(e, [1])["evicted"] == [1]  # only the first block's hash goes
    admit(e, "b", toks)
    # block 0 missed (evicted by the operation); 1 and 2 are still cached but
    # the lookup stops at the first miss
    assert reasons(e, "b") == ["evicted", "chain_broken", "chain_broken"]
    d = details(e, "b")[0]
    assert d is not None and d["cause"] == "evict_op" and d["block_id"] == 1


def test_extra_keys_cache_salt(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "plain", A)
    finish(e, "plain")
    admit(e, "salted", A, cache_salt="tenant-1")
    assert reasons(e, "salted") == ["extra_keys", "cold"]
    d = details(e, "salted")[0]
    assert d == {
        "stored_with": {"lora_name": None, "cache_salt": None},
        "requested_with": {"lora_name": None, "cache_salt": "tenant-1"},
        "with_request": "plain",
    }
    finish(e, "salted")
    admit(e, "lora", A, lora_name="adapter")
    assert reasons(e, "lora") == ["extra_keys", "cold"]
    assert details(e, "lora")[0]["stored_with"] == {  # type: ignore[index]
        "lora_name": None,
        "cache_salt": "tenant-1",
    }


def test_extra_keys_plain_after_salted(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "salted", A, cache_salt="s")
    finish(e, "salted")
    admit(e, "plain", A)
    assert reasons(e, "plain") == ["extra_keys", "cold"]


def test_floor_divergence_inside_a_block(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "a", [1, 2, 3, 4, 5, 6])  # block 0 full, then 5 6
    finish(e, "a")
    admit(e, "b", [1, 2, 3, 4, 5, 6, 9, 9])  # shares 5 6 inside block 1
    assert reasons(e, "b") == [None, "block_size_floor"]
    assert details(e, "b")[1] == {"shared_tokens": 2, "with_request": "a"}


def test_floor_on_the_first_block(engine_factory: Factory) -> None:
    e = engine_factory()
    admit(e, "a", [1, 2, 3, 4, 5])
    finish(e, "a")
    admit(e, "b", [1, 2, 7, 7, 8])  # shares 1 2, less than a block
    assert reasons(e, "b") == ["block_size_floor", "block_size_floor"]
    assert details(e, "b")[0] == {"shared_tokens": 2, "with_request": "a"}
    assert details(e, "b")[1] == {"partial": True, "tokens": 1}


def test_floor_after_decode_tokens(engine_factory: Factory) -> None:
    """A conversation: the next prompt is the previous one plus its output
    plus a new message; the previous request ended inside a block."""
    e = engine_factory(num_blocks=16)
    admit(e, "t1", [1, 2, 3, 4, 5])
    append(e, "t1", [6, 7])  # all tokens 1..7: block 0 full, 5 6 7 in the tail
    finish(e, "t1")
    admit(e, "t2", [1, 2, 3, 4, 5, 6, 7, 20, 21])
    assert reasons(e, "t2") == [None, "block_size_floor", "block_size_floor"]
    assert details(e, "t2")[1] == {"shared_tokens": 3, "with_request": "t1"}


def test_reasons_kept_after_finish_and_bounded(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=64, miss_finished_kept=2)
    for i in range(4):
        admit(e, f"r{i}", [i] * 5)
        finish(e, f"r{i}")
    m = e.analysis.misses  # type: ignore[union-attr]
    assert list(m.finished) == ["r2", "r3"]
    assert reasons(e, "r3") == ["cold", "block_size_floor"]
    assert m.lookup("r0") is None


def test_totals_over_requests(engine_factory: Factory) -> None:
    e = engine_factory(num_blocks=32)
    admit(e, "a", [*A, 1])  # cold cold floor(partial 1)
    finish(e, "a")
    admit(e, "b", [*A, 2, 3])  # hit hit floor(partial 2)
    m = e.analysis.misses  # type: ignore[union-attr]
    assert m.blocks[0] == 2  # hits
    t = m.totals()
    assert t["cold"] == {"blocks": 2, "tokens": 8}
    assert t["block_size_floor"] == {"blocks": 2, "tokens": 3}
    assert m.admissions == 2


def test_reset_drops_are_not_evictions(engine_factory: Factory, clock: Clock) -> None:
    """Blocks a prefix-cache reset dropped miss as ``reset``: no regret, no
    eviction in the rates, and the shadows start over with the pool."""
    from app.pool.schemas import ResetOp
    from blockpool.analysis import views

    e = engine_factory(num_blocks=12)
    assert e.analysis is not None
    an = e.analysis.inline
    assert an is not None
    e.tick()
    toks = list(range(60, 72))  # 3 full blocks
    admit(e, "a", toks)
    finish(e, "a")
    e.tick()
    assert e.apply(ResetOp()) == {"reset": True}
    clock.advance(4)
    admit(e, "b", toks)
    e.tick()
    assert reasons(e, "b") == ["reset", "reset", "reset"]
    d = details(e, "b")[0]
    assert d is not None and d["cause"] == "reset" and d["evicted_ago_seconds"] == 4
    m = an.misses
    assert m.regret.regrets == 0
    assert m.totals()["reset"] == {"blocks": 3, "tokens": 12}
    assert m.totals()["evicted"] == {"blocks": 0, "tokens": 0}
    assert m.ring.evictions == [0, 0, 3]  # by cause: reuse, evict_op, reset
    assert an.rates()["evictions_per_s"] == 0.0
    assert views.regret(an, 5)["evictions_total"] == 0
    sec = views.stream_section(an)
    assert sec["evictions"] == 0 and sec["misses"]["reset"] == 3
    # the shadows were emptied with the pool: append_all at 1x saw what the real
    # pool saw since the reset (b's 12 tokens, no hit)
    sh = views.shadows(an)
    one = next(r for r in sh["shadows"] if r["policy"] == "append_all" and r["factor"] == 1.0)
    assert (one["queries"], one["hits"]) == (12, 0)
    assert sh["real"]["span"] == {"queries_tokens": 12, "hits_tokens": 0, "hit_rate": 0.0}
    finish(e, "b")
