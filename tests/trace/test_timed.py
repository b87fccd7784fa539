"""Timed mode with the scheduler's features off: arrivals, decode, preemption
of the newest, whole prompts."""

from __future__ import annotations

from blockpool import BlockPool, check_invariants, init_none_hash, sha256
from blockpool.trace import Trace, one_pass_curve, parse_mooncake, read_trace
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.scheduled import ScheduledRun, run_scheduled
from blockpool.trace.sched.timed import TimedConfig, replay_timed, simple_scheduler
from tests.trace.helpers import HEAD50, row, rows_to_lines


def _run(trace: Trace, blocks: int, bs: int, cfg: TimedConfig) -> ScheduledRun:
    init_none_hash(sha256)
    pool = BlockPool(blocks, True, bs, False)
    res = CapacityResult(blocks * bs, blocks)
    sched = simple_scheduler(cfg.max_running)
    run = run_scheduled(
        trace, pool, bs, sha256, res, sched, StepModel(cfg.step_ms), cfg.speed, records=True
    )
    check_invariants(pool)
    assert pool.get_num_free_blocks() == blocks - 1
    return run


def test_the_newest_request_is_preempted_and_recomputed() -> None:
    # block size 1, 5 usable blocks.  A (2 + 4 tokens) and B (2 + 3) arrive together.
    trace = parse_mooncake(rows_to_lines([row(0, [1, 2], 2, 4), row(0, [3, 4], 2, 3)]), 1)
    run = _run(trace, 6, 1, TimedConfig(step_ms=1))
    res, x = run.result, run.result.extra
    # step 1 admits both (4 blocks); step 2: A takes the last free block, B finds
    # none and is preempted (it is the newest); A then evicts B's two blocks and
    # finishes at step 4; B is readmitted with its prompt and its one output
    # token (3 tokens a lookup), evicting A's blocks as it goes.
    assert res.preemptions == 1
    a, b = run.records
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert (a.finish_order, b.finish_order) == (0, 1) and (a.e2e_ms, b.e2e_ms) == (4.0, 6.0)
    assert x["preempted_prefix_cache_queries"] == 3 * x["preempted_prefix_cache_lookups"] > 0
    assert (res.hit_tokens, res.evictions, res.admitted) == (0, 6, 2)
    assert res.miss_reasons["cold"] == 4


def test_a_request_that_can_never_fit_is_refused_at_arrival() -> None:
    trace = parse_mooncake(rows_to_lines([row(0, [1, 2], 2, 5), row(1, [1], 1, 1)]), 1)
    res = _run(trace, 6, 1, TimedConfig()).result
    # the first needs 2 + 5 - 1 = 6 blocks of the 5 usable
    assert (res.refused, res.refused_tokens, res.admitted, res.hit_tokens) == (1, 2, 1, 0)


def test_spaced_arrivals_unbounded_hit_like_sequence_mode() -> None:
    trace = read_trace(HEAD50)
    rows = [
        row(i * 1e9, list(r.hash_ids), r.input_length, r.output_length)
        for i, r in enumerate(trace.requests)
    ]
    spaced = parse_mooncake(rows_to_lines(rows))
    (timed,) = replay_timed(spaced, 16, [None], sha256)
    (seq,) = one_pass_curve(trace, 16, [None])
    assert timed.hit_tokens == seq.hit_tokens > 0
    assert timed.evictions == 0 and timed.preemptions == 0
    # the scheduler's slots classify misses as sequence mode does
    assert timed.miss_reasons == seq.miss_reasons and seq.miss_reasons["cold"] > 0
    assert timed.regret_blocks == seq.regret_blocks == 0


def test_a_small_pool_under_load_preempts_and_stays_consistent() -> None:
    trace = read_trace(HEAD50)
    res = _run(trace, 3000, 16, TimedConfig(speed=1000.0)).result
    assert res.preemptions > 0 and res.evictions > 0 and res.refused > 0
    assert res.admitted + res.refused == len(trace)
    assert res.extra["prefix_cache_hits"] >= res.hit_tokens
