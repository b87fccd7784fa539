"""The one-pass curve under vLLM >= 0.24's free order (``uncached_first``):
against one real pool per capacity (ours, per request) and vLLM 0.33.0's own
BlockPool (``bench/parity/curve033.py``), capacity by capacity."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockpool import check_invariants, get_request_block_hasher, sha256
from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST
from blockpool.trace import OnePassCurve, Trace, parse_mooncake, read_trace
from blockpool.trace.replay.sequence import SequencePools
from blockpool.trace.replay.sequence_groups import GroupRequest
from blockpool.trace.workload.keys import make_request
from tests.trace.helpers import HEAD50, row, rows_to_lines, traces
from tests.trace.sched_traces import TOKENS_PER_ID, write_trace
from tests.vllm_envs import REPO, vllm033_python

BLOCK_SIZE = 16


def pools_per_request(
    trace: Trace, bs: int, caps: list[int | None], free_order: str
) -> tuple[SequencePools, list[list[int]]]:
    """One real pool per capacity; each request's hit blocks (-1: refused)."""
    pools = SequencePools(trace, bs, caps, sha256, free_order)  # type: ignore[arg-type]
    hasher = get_request_block_hasher(bs, sha256)
    got: list[list[int]] = [[] for _ in caps]
    for i, req in enumerate(trace.requests):
        r = make_request(trace, req, str(i), hasher)
        view = GroupRequest(r.request_id, r.all_token_ids, r.block_hashes, r.lora_request)
        for d, out in zip(pools.drivers, got, strict=True):
            out.append(d.step(req.input_length, view, r.block_hashes))
    for d in pools.drivers:
        check_invariants(d.pool)
        assert d.pool.get_num_free_blocks() == d.pool.num_gpu_blocks - 1  # all freed
    return pools, got


def assert_same(trace: Trace, bs: int, caps: list[int | None]) -> OnePassCurve:
    curve = OnePassCurve(trace, bs, caps, UNCACHED_FIRST, record_hits=True)
    got = curve.run()
    pools, per_request = pools_per_request(trace, bs, caps, UNCACHED_FIRST)
    assert curve.request_hits == per_request
    for g, d in zip(got, pools.drivers, strict=True):
        w = d.result
        assert g.counts() == w.counts(), g.capacity_tokens
        assert g.miss_reasons == w.miss_reasons, g.capacity_tokens
        assert (g.prompt_tokens, g.refused_tokens, g.regret_blocks, g.admitted) == (
            w.prompt_tokens, w.refused_tokens, w.regret_blocks, w.admitted)  # fmt: skip
    return curve


def test_a_freed_partial_block_is_reused_before_a_cached_one() -> None:
    # block size 2, 2 tokens per id; 3 blocks = 2 usable.  D's partial block
    # is freed between F's and C's blocks: append_all keeps it in the LRU
    # order, so F's allocation evicts C's block; uncached_first reused it
    # first, C's block stays cached and G hits it.
    rows = [row(0, [1], 1), row(1, [3], 2), row(2, [4], 2), row(3, [5], 1),
            row(4, [6], 2), row(5, [4, 7], 3)]  # fmt: skip
    trace = parse_mooncake(rows_to_lines(rows), 2)
    first = assert_same(trace, 2, [6])
    (uf,) = first.results
    assert first.request_hits == [[0, 0, 0, 0, 0, 1]]
    # D evicts B's block (no hashless block left), G evicts F's
    assert (uf.hit_tokens, uf.evictions, uf.refused) == (2, 2, 0)
    (aa,) = OnePassCurve(trace, 2, [6], APPEND_ALL).run()
    # D evicts B's, F evicts C's, G (2 blocks, no hit) D's partial and F's
    assert (aa.hit_tokens, aa.evictions, aa.refused) == (0, 3, 0)


def test_one_stack_when_nothing_is_refused() -> None:
    trace = read_trace(HEAD50)
    caps: list[int | None] = [1 << 17, 1 << 18, 1 << 19, None]
    curve = assert_same(trace, 16, caps)
    assert curve.results[0].refused == 0 and curve.results[0].evictions > 0
    assert curve.stacks == 1  # the inclusion property: one LRU stack for all


def test_the_shared_trace_head_at_five_capacities_and_inf() -> None:
    trace = read_trace(HEAD50)
    caps: list[int | None] = [1 << 14, 1 << 16, 1 << 17, 1 << 18, 1 << 19, None]
    curve = assert_same(trace, 16, caps)
    assert curve.results[0].refused > 0 and curve.stacks > 1
    hits = [r.hit_tokens for r in curve.results]
    assert hits == sorted(hits) and hits[-1] > hits[0]


@given(trace=traces(), bs=st.sampled_from([1, 2, 3, 4]), data=st.data())
def test_generated_traces_agree_per_request_at_every_capacity(
    trace: Trace, bs: int, data: st.DataObject
) -> None:
    sizes = sorted(set(data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=6))))
    caps: list[int | None] = [c * bs for c in sizes]
    assert_same(trace, bs, caps + data.draw(st.sampled_from([[None], []])))


BLOCKS = [60, 150, 300, 700]


@pytest.mark.vllm033
def test_per_request_hits_equal_vllm_033s_block_pool(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", 11, 300)
    done = subprocess.run(
        [vllm033_python(), str(REPO / "bench/parity/curve033.py"), str(tmp_path / "trace.jsonl"),
         "--tokens-per-id", str(TOKENS_PER_ID), "--block-size", str(BLOCK_SIZE),
         "--blocks", ",".join([*map(str, BLOCKS), "inf"])],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    caps: list[int | None] = [b * BLOCK_SIZE for b in BLOCKS] + [None]
    mine = OnePassCurve(trace, BLOCK_SIZE, caps, UNCACHED_FIRST, record_hits=True)
    results = mine.run()
    assert mine.request_hits is not None
    old = OnePassCurve(trace, BLOCK_SIZE, caps, APPEND_ALL).run()
    for key, r, hits, r16 in zip([*map(str, BLOCKS), "inf"], results, mine.request_hits, old,
                                 strict=True):  # fmt: skip
        v = theirs[key]
        assert [h * BLOCK_SIZE if h >= 0 else -1 for h in hits] == v["hits"], key
        assert (r.hit_tokens, r.refused, r.evictions) == (
            v["hit_tokens"], v["refused"], v["evictions"]), key  # fmt: skip
        if key != "inf":  # where blocks are evicted the two free orders part
            assert r16.hit_tokens != r.hit_tokens, key
    assert theirs["60"]["refused"] > 0 and theirs["150"]["evictions"] > 0
    assert theirs["inf"]["evictions"] == 0


@given(trace=traces(), bs=st.sampled_from([1, 2, 4]), data=st.data())
def test_a_larger_pool_never_hits_less_on_any_request(
    trace: Trace, bs: int, data: st.DataObject
) -> None:
    # the inclusion property (docs/sizing.md): among pools refusing nothing, a
    # smaller pool's cached blocks are among a larger one's, request by request
    floor = max(-(-r.input_length // bs) for r in trace.requests) + 1  # blocks
    extra = sorted(set(data.draw(st.lists(st.integers(0, 30), min_size=2, max_size=5))))
    caps: list[int | None] = [(floor + e) * bs for e in extra]
    curve = OnePassCurve(trace, bs, caps, UNCACHED_FIRST, record_hits=True)
    results = curve.run()
    assert curve.request_hits is not None
    for small, large in zip(curve.request_hits, curve.request_hits[1:], strict=False):
        assert all(a <= b for a, b in zip(small, large, strict=True))
    assert all(r.refused == 0 for r in results)
    hits = [r.hit_tokens for r in results]
    assert hits == sorted(hits)
