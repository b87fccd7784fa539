"""Eviction regret: a hash stored again after its eviction, with the gap."""

from __future__ import annotations

from collections.abc import Callable

from app.pool.engine import Engine
from app.pool.schemas import CacheOp
from blockpool.analysis.common import h64
from tests.analysis.conftest import Clock, admit, allocate, append, evict, finish, free

Factory = Callable[..., Engine]
DOC = list(range(200, 212))  # three full blocks


def test_regret_gaps_and_top_prefixes(engine_factory: Factory, clock: Clock) -> None:
    e = engine_factory(num_blocks=16)
    admit(e, "owner", DOC)
    finish(e, "owner")
    clock.advance(2.0)
    assert evict(e, [2, 3])["evicted"] == [2, 3]  # the 2nd and 3rd blocks' hashes go
    clock.advance(1.5)
    admit(e, "victim", DOC)  # hit, evicted, evicted -> two blocks stored again
    m = e.analysis.misses.regret  # type: ignore[union-attr]
    assert m.regrets == 2
    e.tick()
    assert m.regret_gap.count == 2 and m.regret_gap.sum == 3.0  # 1.5 s each
    [top] = m.top_roots(5)
    hashes = e.manager.requests["victim"].block_hashes
    assert top.root == h64(hashes[0])
    assert (top.regrets, top.last_gap, top.max_depth) == (2, 1.5, 2)
    assert (top.last_victim, top.last_owner) == ("victim", "owner")
    assert top.first_tokens == DOC
    rows = m.recent_regret_rows(10)
    assert [r["block_index"] for r in rows] == [2, 1]
    assert {r["gap_seconds"] for r in rows} == {1.5}
    # stored again, the hashes are no longer "evicted"
    finish(e, "victim")
    admit(e, "third", DOC)
    assert m.regrets == 2


def test_regret_on_decode_blocks_and_raw_cache(engine_factory: Factory, clock: Clock) -> None:
    e = engine_factory(num_blocks=16)
    admit(e, "a", [1, 2, 3, 4, 5])
    append(e, "a", [6, 7, 8])  # block 1 (5 6 7 8) is stored as it fills
    finish(e, "a")
    evict(e, [2])
    clock.advance(4.0)
    admit(e, "b", [1, 2, 3, 4, 5])
    append(e, "b", [6, 7, 8])  # the same decode block, stored again
    m = e.analysis.misses.regret  # type: ignore[union-attr]
    assert m.regrets == 1
    e.tick()
    assert m.regret_gap.sum == 4.0
    finish(e, "b")
    # the raw block API: cache a held block with a hash evicted before
    [x] = allocate(e, 1)
    evict(e, [1])  # block 1 held "b"'s first block: its hash goes
    clock.advance(0.25)
    e.apply(CacheOp(block_ids=[x], token_ids=[1, 2, 3, 4]))
    assert m.regrets == 2
    free(e, [x])
    e.tick()
    assert m.regret_gap.sum == 4.25


def test_rates_over_the_window(engine_factory: Factory, clock: Clock) -> None:
    e = engine_factory(num_blocks=16)
    an = e.analysis
    assert an is not None
    e.tick()
    admit(e, "a", DOC)
    finish(e, "a")
    evict(e, [1, 2, 3])
    clock.advance(10)
    admit(e, "b", DOC)
    e.tick()
    r = an.rates()
    assert r["window_s"] == 10
    assert r["regrets_per_s"] == 0.3  # the three blocks are stored again
    assert r["evictions_per_s"] == 0.3
