"""A vLLM 0.16 shadow at 1x agrees with the real pool over random traffic:
the same hits, the same evictions, the same block ids and free-queue order."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from app.pool.engine import Engine
from app.shared.errors import OperationError
from blockpool import (
    BlockPool,
    BlockRemoved,
    NotEnoughBlocksError,
    RequestManager,
    check_invariants,
)
from blockpool.shadow import make_shadow
from tests.analysis.conftest import admit, append, finish

Factory = Callable[..., Engine]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("groups", [1, 2])
def test_library_shadow_matches_the_pool(seed: int, groups: int) -> None:
    rng = random.Random(seed)
    n, bs = rng.randint(8, 60), rng.choice([2, 4])
    pool = BlockPool(n, True, bs, enable_kv_cache_events=True)
    mgr = RequestManager(pool, bs, group_ids=range(groups))
    shadow = make_shadow("append_all", n - 1, bs, groups)
    prefixes = [[rng.randrange(40) for _ in range(rng.randint(0, 20))] for _ in range(5)]
    running: list[str] = []
    evictions = 0
    for step in range(300):
        x = rng.random()
        if x < 0.4:
            toks = rng.choice(prefixes) + [rng.randrange(40) for _ in range(rng.randint(1, 10))]
            rid = f"r{step}"
            try:
                adm = mgr.admit(rid, toks)
            except NotEnoughBlocksError:
                hashes = list(mgr._view(mgr.make_request(rid, toks)))
                assert shadow.admit(rid, hashes, len(toks)) == -1
                continue
            got = shadow.admit(rid, list(mgr.requests[rid].block_hashes), len(toks))
            assert got == adm.num_hit_blocks
            assert shadow.requests[rid].tables == adm.block_ids
            running.append(rid)
        elif x < 0.7 and running:
            rid = rng.choice(running)
            m = mgr.requests[rid]
            before = m.num_tokens
            try:
                mgr.append_tokens(rid, [rng.randrange(40) for _ in range(rng.randint(1, 6))])
            except NotEnoughBlocksError:
                continue  # refused: nothing changed, the shadow is not told
            after = m.num_tokens
            assert shadow.append(rid, after, list(m.block_hashes[before // bs : after // bs]))
            assert shadow.requests[rid].tables == m.block_ids()
        elif running:
            rid = running.pop(rng.randrange(len(running)))
            mgr.finish(rid)
            shadow.finish(rid)
        evictions += sum(
            len(ev.block_hashes) for ev in pool.take_events() if isinstance(ev, BlockRemoved)
        )
        assert shadow.stats.evictions == evictions
        assert shadow.policy.order() == [b.block_id for b in pool.free_block_queue]
    assert shadow.stats.hits == mgr.stats.hits and shadow.stats.queries == mgr.stats.queries
    shadow.check()
    check_invariants(pool)


def test_engine_shadows_match_the_real_pool(engine_factory: Factory) -> None:
    """Inline shadows fed by the engine (request traffic only): append_all@1x
    reports the real pool's hits, queries and evictions; bigger shadows hit
    at least as often on this stream."""
    e = engine_factory(
        num_blocks=48, shadow_factors=[0.5, 2.0, 4.0], shadow_policies=["append_all", "s3fifo"]
    )
    rng = random.Random(7)
    docs = [[rng.randrange(100) for _ in range(rng.randint(4, 40))] for _ in range(6)]
    running: list[str] = []
    for step in range(400):
        x = rng.random()
        try:
            if x < 0.35:
                rid = f"q{step}"
                admit(e, rid, rng.choice(docs) + [rng.randrange(100) for _ in range(5)])
                running.append(rid)
            elif x < 0.75 and running:
                append(e, rng.choice(running), [rng.randrange(100)] * rng.randint(1, 5))
            elif running:
                finish(e, running.pop(rng.randrange(len(running))))
        except OperationError:
            pass  # refused (not enough blocks): nothing changed, the shadows are not told
        if step % 25 == 0:
            e.tick()
    e.tick()
    assert e.analysis is not None and e.analysis.feeder is not None
    rows = {r["name"]: r for r in e.analysis.feeder.latest or []}
    assert set(rows) == {
        "append_all@0.5x", "append_all@1x", "append_all@2x", "append_all@4x", "s3fifo@1x",
    }  # fmt: skip
    one = rows["append_all@1x"]
    st = e.manager.stats
    assert (one["queries"], one["hits"], one["requests"]) == (st.queries, st.hits, st.requests)
    assert one["evictions"] == e.counters.evictions
    assert one["refused"] == 0
    assert rows["append_all@4x"]["hits"] >= rows["append_all@2x"]["hits"] >= one["hits"]
    assert rows["append_all@0.5x"]["capacity"] == 24 and rows["append_all@4x"]["capacity"] == 188
