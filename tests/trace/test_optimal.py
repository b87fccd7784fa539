"""The offline optimum: exact against brute force, and LRU <= optimal <= unbounded."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from blockpool.shadow.pool import make_shadow
from blockpool.trace import OnePassCurve, Trace, parse_mooncake, read_trace
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.workload.keys import BlockKeys
from tests.trace.helpers import HEAD50, row, rows_to_lines, traces


def brute_force(trace: Trace, bs: int, usable: int) -> int:
    """Most prefix-hit blocks of any policy: every choice of which cached
    blocks survive each request, searched exhaustively (states: cached sets)."""
    keys = BlockKeys(trace, bs)
    states: dict[frozenset[int], int] = {frozenset(): 0}
    for req in trace.requests:
        n = req.input_length
        num_blocks = -(-n // bs)
        chain = keys.keys(req)
        max_hit = min((n - 1) // bs, len(chain))
        if num_blocks > usable:
            continue  # refused: nothing changes
        budget = usable - num_blocks
        nxt: dict[frozenset[int], int] = {}
        for cached, best in states.items():
            k = 0
            while k < max_hit and chain[k] in cached:
                k += 1
            others = sorted(cached - set(chain))
            for size in range(min(budget, len(others)) + 1):
                for keep in combinations(others, size):
                    s = frozenset(keep) | frozenset(chain)
                    if nxt.get(s, -1) < best + k:
                        nxt[s] = best + k
        states = nxt
    return max(states.values())


def test_a_worked_example_where_lru_loses() -> None:
    # 1 token per block; 3 usable blocks.  A=[1,2] B=[3,4] A again: LRU keeps
    # B's blocks; the optimum keeps A's [1] through B (budget 3 - 3 = 0 while
    # B runs: nothing survives B) -- so both miss, and both then hit.
    rows = [row(0, [1, 2, 9], 3), row(1, [3, 4, 8], 3), row(2, [1, 2, 7], 3)]
    trace = parse_mooncake(rows_to_lines(rows), 1)
    opt = OptimalCurve(trace, 1)
    assert opt.hit_blocks(3) == 0  # B holds all 3 blocks: A's cannot survive it
    assert opt.hit_blocks(5) == 2  # room for A's two full blocks beside B's three
    assert brute_force(trace, 1, 3) == 0 and brute_force(trace, 1, 5) == 2
    lru = OnePassCurve(trace, 1, [4, 6])  # blocks include the null block
    lru_hits = [r.hit_tokens for r in lru.run()]
    # LRU with 5 usable: after B the queue holds A's 1,2 behind B's blocks: a hit too
    assert lru_hits == [0, 2]


def test_optimal_beats_lru_on_a_scan() -> None:
    # a loop over 4 one-block prompts (+ a last-token block each) in 5 usable
    # blocks: LRU always evicts the block needed next; the optimum keeps some
    rows = [row(i, [i % 4 + 1, 100 + i], 2) for i in range(12)]
    trace = parse_mooncake(rows_to_lines(rows), 1)
    (lru,) = OnePassCurve(trace, 1, [6]).run()
    opt = OptimalCurve(trace, 1).hit_blocks(5)
    assert lru.hit_tokens == 0
    assert opt == brute_force(trace, 1, 5) > 0


def _small_traces() -> st.SearchStrategy[Trace]:
    return traces(max_requests=6)


@settings(max_examples=150, deadline=None)
@given(trace=_small_traces(), usable=st.integers(1, 7), data=st.data())
def test_optimal_equals_brute_force(trace: Trace, usable: int, data: st.DataObject) -> None:
    bs = data.draw(st.sampled_from([1, 2]))
    got = OptimalCurve(trace, bs).hit_blocks(usable)
    assert got == brute_force(trace, bs, usable)


@given(trace=traces(), bs=st.sampled_from([1, 2, 3, 4]), data=st.data())
def test_lru_and_s3fifo_never_beat_it_and_it_never_beats_unbounded(
    trace: Trace, bs: int, data: st.DataObject
) -> None:
    usable = sorted(set(data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))))
    caps: list[int | None] = [(u + 1) * bs for u in usable] + [None]
    curve = OnePassCurve(trace, bs, caps)
    results = curve.run()
    opt = OptimalCurve(trace, bs, curve.keys)
    best = opt.hit_tokens([*usable, None])
    assert best[-1] == results[-1].hit_tokens  # unbounded: nothing to choose
    keys = BlockKeys(trace, bs)
    for u, lru, o in zip(usable, results, best, strict=False):
        assert lru.hit_tokens <= o <= best[-1]
        shadow = make_shadow("s3fifo", u, bs)
        for req in trace.requests:
            hashes = [k.to_bytes(8, "big", signed=True) for k in keys.keys(req)]
            shadow.admit("r", hashes, req.input_length)
            shadow.finish("r")
        shadow.check()
        assert shadow.stats.hits <= o


def test_the_shared_trace_head() -> None:
    trace = read_trace(HEAD50)
    caps: list[int | None] = [1 << 14, 1 << 16, 1 << 18, None]
    curve = OnePassCurve(trace, 16, caps)
    results = curve.run()
    best = OptimalCurve(trace, 16, curve.keys).hit_tokens(
        [None if c is None else c // 16 - 1 for c in caps]
    )
    assert best[-1] == results[-1].hit_tokens
    for r, o in zip(results, best, strict=True):
        assert r.hit_tokens <= o <= best[-1]
    assert best[1] > results[1].hit_tokens  # the optimum has room to gain here
