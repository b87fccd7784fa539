"""Sequence mode over KV-cache groups (sliding windows, hybrid models), and
what the planner gives for them: hand-made traces with exact hits, the
refusals, the unbounded ceiling as a bound, the target search and the CLI."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cli import main
from blockpool import check_invariants, sha256
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, GroupSpec
from blockpool.core.block_hasher import get_request_block_hasher
from blockpool.trace import parse_mooncake
from blockpool.trace.plan.planner import (
    NO_OPTIMUM,
    group_hit_tokens,
    group_sweep_range,
    group_unbounded_hit_tokens,
    smallest_group_capacity,
)
from blockpool.trace.plan.report import replay_trace
from blockpool.trace.replay.optimal import OptimalCurve
from blockpool.trace.replay.sequence import SequenceDriver, SequencePools
from blockpool.trace.replay.sequence_groups import (
    GroupRequest,
    GroupSequenceDriver,
    vllm_token_capacity,
)
from blockpool.trace.workload.keys import make_request
from blockpool.trace.workload.reader import Trace
from tests.trace.helpers import row, rows_to_lines, traces

WINDOW = [GroupSpec(SLIDING_WINDOW, 16, 33)]  # the next token needs 2 blocks
HYBRID = [GroupSpec(FULL_ATTENTION, 16), GroupSpec(SLIDING_WINDOW, 16, 33)]
ROWS = [
    row(0, [1, 2, 3, 4, 5, 6], 96),
    row(1, [1, 2, 3, 4, 5, 6, 7], 112),
    row(2, [9, 10, 11, 12], 64),
    row(3, [1, 2, 3, 4, 5, 6, 7], 112),
]


def _trace() -> Trace:
    return parse_mooncake(rows_to_lines(ROWS), 16)  # one block per id


def _per_request(
    trace: Trace, blocks: int, groups: list[GroupSpec] | None
) -> tuple[list[int], SequencePools]:
    """Each request's hit tokens (-1: refused) on a pool of ``blocks``."""
    pools = SequencePools(trace, 16, [blocks * 16], sha256, groups=groups)
    d = pools.drivers[0]
    if isinstance(d, GroupSequenceDriver):
        d.hits = []
        pools.run()
        assert d.hits is not None
        got = d.hits
    else:
        assert isinstance(d, SequenceDriver)
        got = []
        step = d.step
        d.step = lambda n, r, h: got.append(step(n, r, h) * 16) or 0  # type: ignore[method-assign]
        pools.run()
    check_invariants(d.pool)
    return got, pools


def test_a_window_hits_where_full_attention_misses() -> None:
    # 9 blocks, 8 usable.  Request 1 hits 6 blocks in both; the window touches
    # only the last two (b5, b6) and nulls b1..b4, which stay at the head of
    # the free queue.  Request 2 (4 new blocks) then evicts the never-used
    # block and b2..b4 under the window, but b5..b7 under full attention
    # (which touched them all).  Request 3: full attention finds b1..b4 (64
    # tokens); the window finds the run b5, b6 and hits 96.
    trace = _trace()
    full, _ = _per_request(trace, 9, None)
    window, pools = _per_request(trace, 9, WINDOW)
    assert full == [0, 96, 0, 64]
    assert window == [0, 96, 0, 96]
    res = pools.drivers[0].result
    assert (res.hit_tokens, res.evictions, res.refused, res.admitted) == (192, 4, 0, 4)
    assert not res.classified and res.to_json()["miss_reasons"] is None


def test_hybrid_refuses_what_the_pool_cannot_hold_and_changes_nothing() -> None:
    trace = _trace()
    # 12 blocks (11 usable): a 6-block prompt takes 12 in two groups; the
    # 4-block one takes 8
    hits, pools = _per_request(trace, 12, HYBRID)
    assert hits == [-1, -1, 0, -1]
    res = pools.drivers[0].result
    assert (res.refused, res.refused_tokens, res.admitted) == (3, 320, 1)
    # a refusal leaves the free queue and the cache as they were
    d = pools.drivers[0]
    assert isinstance(d, GroupSequenceDriver)
    pool = d.pool
    before = ([b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
              dict(pool.cached_block_hash_to_block._cache))  # fmt: skip
    r3 = trace.requests[3]
    req = make_request(trace, r3, "again", get_request_block_hasher(16, sha256))
    view = GroupRequest("again", req.all_token_ids, req.block_hashes, None)
    assert d.step(r3.input_length, view, req.block_hashes) == -1
    after = ([b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
             dict(pool.cached_block_hash_to_block._cache))  # fmt: skip
    assert after == before and pool.take_events() == []
    check_invariants(pool)
    # 20 blocks hold every prompt: request 1 and 3 hit 96 in both groups
    hits, _ = _per_request(trace, 20, HYBRID)
    assert hits == [0, 96, 0, 96]


def test_vllm_token_capacity() -> None:
    # vLLM's "GPU KV cache size": num_blocks // groups * block size
    assert vllm_token_capacity(1001, HYBRID) == 500 * 16
    assert vllm_token_capacity(1001, WINDOW) == 1001 * 16


@st.composite
def layouts(draw: st.DrawFn) -> list[GroupSpec]:
    full = draw(st.integers(0, 2))
    windows = draw(st.lists(st.integers(1, 40), min_size=0 if full else 1, max_size=2))
    return [GroupSpec(FULL_ATTENTION, 4)] * full + [
        GroupSpec(SLIDING_WINDOW, 4, w) for w in windows
    ]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), specs=layouts(), sizes=st.lists(st.integers(2, 60), min_size=1, max_size=4))
def test_the_unbounded_ceiling_bounds_every_size_and_is_reached(
    trace: Trace, specs: list[GroupSpec], sizes: list[int]
) -> None:
    ceiling = group_unbounded_hit_tokens(4, OptimalCurve(trace, 4))
    pools = SequencePools(trace, 4, [b * 4 for b in sizes] + [None], sha256, groups=specs)
    results = pools.run()
    for d in pools.drivers:
        check_invariants(d.pool)
    for r in results[:-1]:
        assert r.hit_tokens <= ceiling
        assert r.admitted + r.refused == len(trace)
    assert results[-1].hit_tokens == ceiling and results[-1].refused == 0


def test_sweep_range_and_target_search() -> None:
    rows = []
    for i in range(40):
        base = [1, 2, 3] if i % 3 else [7, 8]
        rows.append(row(i, [*base, 100 + i % 5], 16 * 4 * len(base) + 30, 2))
    trace = parse_mooncake(rows_to_lines(rows), 64)
    opt = OptimalCurve(trace, 16)
    lo, hi = group_sweep_range(trace, HYBRID, opt)
    pools = SequencePools(trace, 16, [lo * 16, (lo - 1) * 16, hi * 16], sha256, groups=HYBRID)
    at_lo, below, at_hi = pools.run()
    assert at_lo.refused == 0 < below.refused
    assert at_hi.hit_tokens == group_unbounded_hit_tokens(16, opt)
    ans = smallest_group_capacity(trace, HYBRID, 0.3, sha256, opt)
    assert ans.optimal_blocks is None and ans.optimal_reason == NO_OPTIMUM
    assert ans.lru_blocks is not None and ans.search
    need = 0.3 * trace.prompt_tokens
    reach, short = group_hit_tokens(trace, HYBRID, [ans.lru_blocks, ans.lru_blocks - 1], sha256)
    assert reach >= need > short
    none = smallest_group_capacity(trace, HYBRID, 0.99, sha256, opt)
    assert none.lru_blocks is None and none.unbounded_hit_rate < 0.99


def test_replay_trace_refuses_what_groups_do_not_have() -> None:
    trace = _trace()
    with pytest.raises(ValueError, match="timed replay models one full-attention"):
        replay_trace(trace, mode="timed", groups=HYBRID)
    with pytest.raises(ValueError, match="no one pass over these KV-cache groups"):
        replay_trace(trace, one_pass=True, groups=HYBRID)
    rep = replay_trace(trace, capacities_tokens=[9 * 16, None], groups=WINDOW)
    assert not rep.one_pass and rep.info["kv_cache_groups"][0]["sliding_window"] == 33
    assert [r.hit_tokens for r in rep.results] == [192, 192]
    # one full-attention group is the plain model: the one-pass curve
    plain = replay_trace(trace, capacities_tokens=[9 * 16], groups=[GroupSpec()])
    assert plain.one_pass and plain.results[0].hit_tokens == 160


# ------------------------------------------------------------------- the CLI


@pytest.fixture
def hybrid_cli(tmp_path: Path) -> list[str]:
    """``blockpool trace`` over the hand-made trace with a layout of full
    attention and a 33-token window (64 bytes a token in each group)."""
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(rows_to_lines(ROWS)) + "\n")
    return [
        "trace", str(p), "--tokens-per-id", "16", "--bytes-per-token", "64", "--quiet",
        "--kv-cache-groups", "full,sliding:33",
    ]  # fmt: skip


def test_cli_names_the_groups_and_the_absent_optimum(
    hybrid_cli: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*hybrid_cli, "--capacity", "10KiB,20KiB,inf", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [g["kind"] for g in doc["kv_cache_groups"]] == [FULL_ATTENTION, SLIDING_WINDOW]
    assert doc["optimal"] is None and doc["optimal_reason"] == NO_OPTIMUM
    assert doc["policies"] == ["lru"] and doc["one_pass"] is False
    assert "not classified" in doc["miss_reasons_note"]
    small, big, inf = doc["results"]
    # 10 KiB / 1 KiB a block = 10 blocks: every 6-block prompt takes 12
    assert (small["blocks"], small["kv_cache_tokens"], small["refused"]) == (10, 80, 3)
    assert (big["blocks"], big["kv_cache_tokens"], big["hit_tokens"]) == (20, 160, 192)
    assert (
        inf["kv_cache_tokens"] is None and inf["hit_tokens"] == doc["unbounded_hit_tokens"] == 192
    )
    for r in doc["results"]:
        assert r["optimal_hit_tokens"] is None and r["miss_reasons"] is None
        assert "optimal_hit_rate" not in r

    assert main([*hybrid_cli, "--capacity", "10KiB,20KiB"]) == 0
    out = capsys.readouterr().out
    assert "KV-cache groups: full_attention, sliding_window 33" in out
    assert f"optimal: none -- {NO_OPTIMUM}" in out
    header = next(line for line in out.splitlines() if "usable (tokens)" in line)
    assert "vLLM KV cache (tokens)" in header and "optimal" not in header

    assert main([*hybrid_cli, "--capacity", "10KiB,20KiB", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["kv_cache_tokens"] for r in rows] == ["80", "160"]
    assert all(r["optimal_reason"] == NO_OPTIMUM and r["cold_blocks"] == "" for r in rows)
    assert "optimal_hit_rate" not in rows[0]


def test_cli_target_and_refusals_over_groups(
    hybrid_cli: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*hybrid_cli, "--target-hit-rate", "0.3", "--json"]) == 0
    target = json.loads(capsys.readouterr().out)["target"]
    assert target["optimal"] is None and target["optimal_reason"] == NO_OPTIMUM
    assert "monotonically" in target["search"]
    # 30% of 384 tokens: 192 hit at 18 blocks, 96 at 17 (both prompts of 7 ids fit)
    assert target["lru"]["blocks"] == 18
    assert main([*hybrid_cli, "--policies", "s3fifo"]) == 2
    assert "shadow policies (s3fifo)" in capsys.readouterr().err


def test_cli_sweep_over_groups_spans_the_group_range(
    hybrid_cli: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    png = tmp_path / "curve.png"
    plot = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    assert main([*hybrid_cli, "--sweep", "--sweep-points", "4", "--json", *plot]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    blocks = [r["blocks"] for r in results]
    lo, hi = group_sweep_range(_trace(), HYBRID, OptimalCurve(_trace(), 16))
    # the largest prompt (7 blocks) in both groups and the null block: 15;
    # 11 distinct full blocks (ids 1-7, 9-12) in two groups above it
    assert (lo, hi) == (15, 15 + 2 * 11)
    assert blocks[0] == lo and blocks[-2] == hi and blocks[-1] is None
    assert results[0]["refused"] == 0 and results[-2]["hit_tokens"] == 192
    if plot:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
