"""The one-pass curve against one real pool per capacity, capacity by capacity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockpool import BlockPool, NotEnoughBlocksError, RequestManager, check_invariants, sha256
from blockpool.trace import OnePassCurve, Trace, one_pass_curve, parse_mooncake, read_trace
from blockpool.trace.replay.sequence import SequencePools
from blockpool.trace.workload.keys import BlockKeys, trace_chains
from tests.trace.helpers import HEAD50, row, rows_to_lines, traces


def _pools(trace: Trace, bs: int, caps: list[int | None]) -> SequencePools:
    pools = SequencePools(trace, bs, caps, sha256)
    pools.run()
    for d in pools.drivers:
        check_invariants(d.pool)
        assert d.pool.get_num_free_blocks() == d.pool.num_gpu_blocks - 1  # all freed
    return pools


def _assert_same(trace: Trace, bs: int, caps: list[int | None]) -> OnePassCurve:
    curve = OnePassCurve(trace, bs, caps)
    got = curve.run()
    want = [d.result for d in _pools(trace, bs, caps).drivers]
    for g, w in zip(got, want, strict=True):
        assert g.capacity_tokens == w.capacity_tokens and g.blocks == w.blocks
        assert g.counts() == w.counts(), g.capacity_tokens
        assert g.miss_reasons == w.miss_reasons, g.capacity_tokens
        assert (g.prompt_tokens, g.refused_tokens, g.regret_blocks, g.admitted) == (
            w.prompt_tokens,
            w.refused_tokens,
            w.regret_blocks,
            w.admitted,
        )
    return curve


def test_a_worked_example() -> None:
    # block size 2, 2 tokens per id; 3 blocks = 2 usable at 6 tokens
    trace = parse_mooncake(
        rows_to_lines([row(0, [1, 2], 4), row(1, [1, 2], 4), row(2, [1, 2, 3], 5)]), 2
    )
    small, inf = one_pass_curve(trace, 2, [6, None])
    # A: 2 cold blocks.  B: block 0 hits; block 1 is cached but holds the last
    # token, and the pop for it takes A's block 1 from the head: an eviction.
    # C needs 3 blocks: refused at 2 usable.
    assert (small.hit_tokens, small.evictions, small.refused) == (2, 1, 1)
    assert small.miss_reasons == {"last_token": 1, "block_size_floor": 0, "cold": 2, "evicted": 0}
    # unbounded: B hits 1 block, C hits both full blocks (4 tokens), its tail is partial
    assert (inf.hit_tokens, inf.evictions, inf.refused) == (6, 0, 0)
    assert inf.miss_reasons == {"last_token": 1, "block_size_floor": 1, "cold": 2, "evicted": 0}
    assert inf.hit_rate == pytest.approx(6 / 13)
    _assert_same(trace, 2, [6, None])


def test_a_refused_request_stores_nothing_where_it_was_refused() -> None:
    # block size 2, 2 tokens per id; 8 tokens = 4 blocks = 3 usable
    rows = [row(0, [1], 2), row(1, [1, 2, 3, 4], 8), row(2, [1, 2], 4), row(3, [1, 2, 3], 5)]
    trace = parse_mooncake(rows_to_lines(rows), 2)
    curve = _assert_same(trace, 2, [8, None])
    small, inf = curve.results
    assert curve.stacks == 2  # the small pool left at the refusal
    # B's second block was stored only by the refused request: cold at 3 usable,
    # cached (but holding B's last token) where that request was taken
    assert (small.refused, inf.refused) == (1, 0)
    assert small.miss_reasons["cold"] == 2 and small.miss_reasons["last_token"] == 0  # A, B
    assert inf.miss_reasons["cold"] == 4 and inf.miss_reasons["last_token"] == 1


def test_the_shared_trace_head_at_five_capacities_and_inf() -> None:
    trace = read_trace(HEAD50)
    caps: list[int | None] = [1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 19, None]
    curve = _assert_same(trace, 16, caps)
    results = curve.results
    assert results[0].refused > 0  # 1024 blocks: the long prompts do not fit
    assert curve.stacks > 1  # ... so the small pool left the shared stack
    hits = [r.hit_tokens for r in results]
    assert hits[-1] > hits[0] and results[-1].evictions == 0


@given(trace=traces(), bs=st.sampled_from([1, 2, 3, 4]), data=st.data())
def test_generated_traces_agree_at_every_capacity(
    trace: Trace, bs: int, data: st.DataObject
) -> None:
    caps: list[int | None] = sorted(
        set(data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=6)))
    )
    caps = [c * bs for c in caps] + data.draw(st.sampled_from([[None], []]))
    _assert_same(trace, bs, caps)


def test_sequence_driver_matches_the_request_manager() -> None:
    trace = read_trace(HEAD50)
    caps: list[int | None] = [1 << 15, 1 << 17]
    drivers = _pools(trace, 16, caps).drivers
    for cap, d in zip(caps, drivers, strict=True):
        assert cap is not None
        pool = BlockPool(cap // 16, True, 16, True)
        mgr = RequestManager(pool, hash_fn=sha256)
        hits = evictions = refused = 0
        for req in trace.requests:
            try:
                adm = mgr.admit(str(req.index), trace.prompt_token_ids(req))
            except NotEnoughBlocksError:
                refused += 1
                continue
            hits += adm.num_computed_tokens
            mgr.finish(str(req.index))
            evictions += sum(len(e.block_hashes) for e in pool.take_events()
                             if type(e).__name__ == "BlockRemoved")  # fmt: skip
        check_invariants(pool)
        assert (hits, evictions, refused) == d.result.counts()
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [
            b.block_id for b in d.pool.free_block_queue.get_all_free_blocks()
        ]


def test_a_pool_of_one_block_refuses_everything() -> None:
    trace = read_trace(HEAD50)
    (r,) = one_pass_curve(trace, 16, [16])
    assert (r.blocks, r.refused, r.hit_tokens, r.admitted) == (1, 50, 0, 0)
    with pytest.raises(ValueError, match="hold no block"):
        one_pass_curve(trace, 16, [15])


@given(trace=traces(), bs=st.sampled_from([1, 2, 3, 4, 8]))
def test_block_key_chains_are_the_keys(trace: Trace, bs: int) -> None:
    a, b = BlockKeys(trace, bs), BlockKeys(trace, bs)
    for req in trace.requests:
        assert a.chain(req).tolist() == b.keys(req)


@given(trace=traces(), bs=st.sampled_from([1, 2, 3, 4, 8]))
def test_bulk_chains_name_blocks_as_the_keys_do(trace: Trace, bs: int) -> None:
    # numbered apart, but one int for one prefix both ways: a bijection
    keys = BlockKeys(trace, bs)
    there: dict[int, int] = {}
    back: dict[int, int] = {}
    bulk = trace_chains(trace, bs)
    assert len(bulk) == len(trace.requests)
    for req, got in zip(trace.requests, bulk, strict=True):
        want = keys.keys(req)
        assert len(got) == len(want)
        for g, w in zip(got.tolist(), want, strict=True):
            assert there.setdefault(w, g) == g and back.setdefault(g, w) == w


def test_bulk_chains_of_the_shared_trace_head() -> None:
    trace = read_trace(HEAD50)
    keys = BlockKeys(trace, 16)
    seen: dict[int, int] = {}
    for req, got in zip(trace.requests, trace_chains(trace, 16), strict=True):
        want = keys.keys(req)
        assert [seen.setdefault(g, w) for g, w in zip(got.tolist(), want, strict=True)] == want
    assert len(set(seen.values())) == len(seen)
