"""Timed mode on KV-cache groups (full attention and sliding windows):
what a window changes in the scheduler's pool, without vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from blockpool import BlockPool, check_invariants, init_none_hash, sha256
from blockpool.core.admission import cdiv
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, GroupSpec
from blockpool.core.metrics import KVCacheMetricsCollector
from blockpool.trace.plan.report import replay_trace
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sched.group_slots import GroupSlots, parse_groups, peak_blocks
from blockpool.trace.sched.scheduled import ScheduledRun, run_scheduled
from blockpool.trace.sched.scheduler import SchedulerConfig
from blockpool.trace.sched.timed import TimedConfig
from blockpool.trace.workload.reader import Trace, TraceRequest
from tests.trace.sched_traces import write_trace

ASYNC = SchedulerConfig(512, 256, True, 0, None, "fcfs", True)
SYNC = SchedulerConfig(512, 256, True, 0, None, "fcfs", False)
W128 = [GroupSpec(SLIDING_WINDOW, 16, 128)]


class Watched(GroupSlots):
    """GroupSlots that note the most blocks one request held after a chunk."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.peak = 0
        allocate = self.coordinator.allocate_slots

        def watched(request: Any, *a: Any, **kw: Any) -> Any:
            got = allocate(request, *a, **kw)
            if got is not None:
                self.peak = max(self.peak, self.num_blocks(request.request_id))
            return got

        self.coordinator.allocate_slots = watched  # type: ignore[method-assign]


def _run(
    trace: Trace, blocks: int, groups: Sequence[GroupSpec], cfg: SchedulerConfig = ASYNC
) -> tuple[ScheduledRun, Watched | None]:
    init_none_hash(sha256)
    pool = BlockPool(blocks, True, 16, False)
    res = CapacityResult(None, blocks)
    slots = Watched(pool, groups, cfg.model_len, res.misses) if groups else None
    run = run_scheduled(trace, pool, 16, sha256, res, cfg, records=True, slots=slots,
                        groups=groups)  # fmt: skip
    check_invariants(pool)
    assert pool.get_num_free_blocks() == blocks - 1  # everything finished and freed
    return run, slots


def _decoders(n: int, out: int) -> Trace:
    """``n`` requests at once, 64 private prompt tokens each, ``out`` outputs."""
    return Trace([TraceRequest(i, 0.0, 64, out, (100 + i,)) for i in range(n)], 64)


@pytest.mark.parametrize("cfg", [ASYNC, SYNC])
def test_a_long_decode_under_a_window_holds_only_the_windows_blocks(
    cfg: SchedulerConfig,
) -> None:
    trace = _decoders(2, 1500)
    full, _ = _run(trace, 150, [])
    # each needs cdiv(64 + 1499, 16) = 98 of the 149 blocks: the two cannot both run
    assert full.result.preemptions > 0
    windowed, slots = _run(trace, 150, W128, cfg)
    assert windowed.result.preemptions == 0
    assert [r.preemptions for r in windowed.records] == [0, 0]
    assert sorted(r.finish_order for r in windowed.records) == [0, 1]
    # a decoding token attends to 128 tokens: at most 128 / 16 + 1 blocks held
    assert slots is not None and slots.peak == 9 == peak_blocks(W128, 1563, 1)


def test_full_plus_window_preempts_by_the_full_groups_blocks() -> None:
    trace = _decoders(2, 1500)
    groups = [GroupSpec(FULL_ATTENTION, 16), *W128]
    # 98 full-attention blocks + 9 window blocks each: one fits in 150, two do not
    run, slots = _run(trace, 150, groups)
    assert run.result.preemptions > 0
    assert slots is not None and slots.peak == 98 + 9
    bigger, _ = _run(trace, 2 * 107 + 1, groups)
    assert bigger.result.preemptions == 0


def test_a_window_hits_a_finished_prompt_and_names_its_misses() -> None:
    ids = tuple(range(1, 6))  # 5 ids x 64 tokens = 20 full blocks
    trace = Trace([TraceRequest(0, 0.0, 320, 2, ids), TraceRequest(1, 5000.0, 320, 2, ids)], 64)
    run, slots = _run(trace, 60, W128)
    first, second = run.records
    assert first.cached_tokens == 0
    assert second.cached_tokens == 304  # all but the block of the last token
    res = run.result
    assert res.hit_tokens == 304
    # the second's block 19 is cached but holds its last token; the first's 20 are cold
    assert dict(res.miss_reasons) == {
        "last_token": 1, "block_size_floor": 0, "cold": 20, "evicted": 0,
    }  # fmt: skip
    assert res.extra["prefix_cache_hits"] == 304
    assert res.extra["kv_cache_groups"] == [
        {"kind": "sliding_window", "block_size": 16, "sliding_window": 128}
    ]
    assert slots is not None and slots.peak <= peak_blocks(W128, 321, 512)


def test_one_full_attention_group_runs_on_the_plain_slots() -> None:
    trace = _decoders(3, 400)
    init_none_hash(sha256)
    plain = run_scheduled(trace, BlockPool(60, True, 16, False), 16, sha256,
                          CapacityResult(None, 60), ASYNC, records=True)  # fmt: skip
    one = run_scheduled(trace, BlockPool(60, True, 16, False), 16, sha256,
                        CapacityResult(None, 60), ASYNC, records=True,
                        groups=[GroupSpec()])  # fmt: skip
    assert plain.records == one.records
    assert "kv_cache_groups" not in one.result.extra


def test_timed_replay_reports_the_groups_and_refuses_by_the_peak() -> None:
    # 64 + 3999 tokens: 254 blocks under full attention, 9 under a 128-token window
    trace = Trace([TraceRequest(0, 0.0, 64, 4000, (7,))], 64)
    cap = 100 * 16
    timed = TimedConfig(scheduler=SYNC, groups=tuple(W128))
    report = replay_trace(trace, mode="timed", capacities_tokens=[cap, None], timed=timed)
    windowed, unbounded = report.results
    assert windowed.refused == 0 and windowed.admitted == 1
    assert windowed.extra["kv_cache_groups"][0]["sliding_window"] == 128
    assert unbounded.admitted == 1
    full = replay_trace(trace, mode="timed", capacities_tokens=[cap],
                        timed=TimedConfig(scheduler=SYNC))  # fmt: skip
    assert full.results[0].refused == 1 and full.results[0].admitted == 0


def test_parse_groups() -> None:
    assert parse_groups("full, sliding:64", 16) == [
        GroupSpec(FULL_ATTENTION, 16), GroupSpec(SLIDING_WINDOW, 16, 64)
    ]  # fmt: skip
    for bad, why in (
        ("full,window=3", "'window=3' is not a group"),
        ("sliding:0", "'sliding:0': a window and a count are 1"),
        ("sliding=x", "'sliding=x' is not a group"),
        ("", "'' is not a group"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_groups(bad, 16)


def test_a_retried_lookup_reuses_its_hit_only_while_its_hashes_are_untouched(
    tmp_path: Path,
) -> None:
    """The same replay with the lookups memoised and (a pool with its own
    metrics collector) without: the same story for every request."""
    trace = write_trace(tmp_path / "t.jsonl", 7, 120)
    groups = parse_groups("full,sliding:64", 16)
    runs = []
    for collector in (None, KVCacheMetricsCollector()):
        init_none_hash(sha256)
        pool = BlockPool(300, True, 16, False, collector)
        res = CapacityResult(None, 300)
        slots = GroupSlots(pool, groups, 1 << 20, res.misses)
        searches = 0
        find = slots.coordinator.find_longest_cache_hit

        def counted(*a: Any, find: Any = find) -> Any:
            nonlocal searches
            searches += 1
            return find(*a)

        slots.coordinator.find_longest_cache_hit = counted  # type: ignore[method-assign]
        run = run_scheduled(trace, pool, 16, sha256, res, ASYNC, records=True, slots=slots,
                            groups=groups)  # fmt: skip
        check_invariants(pool)
        lookups = res.extra["prefix_cache_lookups"] + res.extra["preempted_prefix_cache_lookups"]
        runs.append((run.records, res.preemptions, res.extra["prefix_cache_hits"], searches,
                     lookups, dict(res.miss_reasons)))  # fmt: skip
    (recs, pre, hits, memo_searches, n, why), (recs2, pre2, hits2, searches2, n2, why2) = runs
    assert (recs, pre, hits, n, why) == (recs2, pre2, hits2, n2, why2)
    assert pre > 0 and searches2 == n  # without the memo every lookup searches
    assert memo_searches < n // 2  # most retries of a blocked head reuse their hit


def test_peak_blocks_is_the_most_a_window_can_hold() -> None:
    """Before a chunk of ``n`` tokens after ``c`` computed a window holds
    blocks ``(c - w + 1) // bs`` to ``cdiv(c + n, bs) - 1``: the bound is the
    most of that over every ``c``, no more (a larger one refuses requests
    vLLM finishes)."""
    for bs in (4, 16):
        for w in range(1, 41):
            for n in (1, 2, 3, 5, 16, 17, 33):
                held = max(cdiv(c + n, bs) - max(0, c - w + 1) // bs for c in range(0, 400 - n + 1))
                assert peak_blocks([GroupSpec(SLIDING_WINDOW, bs, w)], 400, n) == held, (bs, w, n)


def test_a_request_at_the_windows_exact_peak_is_served() -> None:
    # a 17-token window and 17-token chunks hold at most 1 + cdiv(17 + 17 - 2, 16) = 3
    # blocks: a pool of 3 (and the null block) serves the request
    w17 = [GroupSpec(SLIDING_WINDOW, 16, 17)]
    trace = Trace([TraceRequest(0, 0.0, 100, 30, (1, 2))], 64)
    for cfg in (SchedulerConfig(17, 1, True, 0, None, "fcfs", a) for a in (True, False)):
        run, slots = _run(trace, 4, w17, cfg)
        assert run.result.refused == 0 and run.records[0].finish_order == 0
        assert slots is not None and slots.peak == 3 == peak_blocks(w17, 129, 17)
