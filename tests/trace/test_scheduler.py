"""vLLM's scheduler model in timed mode: budget, chunks, async, limits, stats."""

from __future__ import annotations

from pathlib import Path

import pytest

from blockpool import BlockPool, check_invariants, init_none_hash, sha256
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sched.engine_core import StepModel, fit_step_model
from blockpool.trace.sched.scheduled import ScheduledRun, run_scheduled
from blockpool.trace.sched.scheduler import SchedulerConfig
from blockpool.trace.sched.timed import TimedConfig, replay_timed
from blockpool.trace.workload.reader import Trace, TraceRequest
from tests.trace.sched_traces import write_trace

OFF = SchedulerConfig(None, 256, False, 0, None, "fcfs", False)


def _run(trace: Trace, blocks: int, cfg: SchedulerConfig, step: StepModel | None = None
         ) -> tuple[ScheduledRun, BlockPool]:  # fmt: skip
    init_none_hash(sha256)
    pool = BlockPool(blocks, True, 16, False)
    run = run_scheduled(trace, pool, 16, sha256, CapacityResult(None, blocks), cfg, step,
                        records=True)  # fmt: skip
    check_invariants(pool)
    assert pool.get_num_free_blocks() == blocks - 1  # everything finished and freed
    return run, pool


def _req(i: int, ts: float, ids: list[int], length: int, out: int) -> TraceRequest:
    return TraceRequest(i, ts, length, out, tuple(ids))


@pytest.mark.parametrize("cap", [3200, 4800, 9600, None])
def test_without_a_config_timed_mode_runs_the_scheduler_with_every_feature_off(
    tmp_path: Path, cap: int | None
) -> None:
    trace = write_trace(tmp_path / "t.jsonl", 1, 120)
    init_none_hash(sha256)
    (simple,) = replay_timed(trace, 16, [cap], sha256, config=TimedConfig(step_ms=20))
    cfg = TimedConfig(step_ms=20, scheduler=OFF)
    (vllm,) = replay_timed(trace, 16, [cap], sha256, config=cfg)
    assert vllm.to_json() == simple.to_json()
    assert simple.extra["scheduler"]["enable_chunked_prefill"] is False
    if cap is not None and cap <= 4800:
        assert vllm.preemptions > 0  # the comparison covers preemption
    assert sum(vllm.miss_reasons.values()) > 0


def test_a_long_prompt_is_admitted_on_its_first_chunk_and_runs_in_chunks() -> None:
    # 100 prompt tokens, a budget of 32 a step: chunks 32, 32, 32, 4; the
    # first token comes out of the 4th step, the second of the 5th.
    trace = Trace([_req(0, 0.0, [1, 2], 100, 2)], 64)
    cfg = SchedulerConfig(32, 4, True, 0, None, "fcfs", False)
    run, _ = _run(trace, 20, cfg, StepModel(10.0))
    (rec,) = run.records
    assert (rec.queue_ms, rec.ttft_ms, rec.e2e_ms) == (0.0, 40.0, 50.0)
    assert run.result.extra["steps"] == 6  # + the step that reports the finish
    # Without chunked prefill the same budget never admits it: refused up front.
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        SchedulerConfig(32, 4, False, 0, 64, "fcfs", False)


def test_the_threshold_caps_a_prompts_tokens_per_step() -> None:
    trace = Trace([_req(0, 0.0, [1, 2], 100, 1)], 64)
    cfg = SchedulerConfig(1000, 4, True, 25, None, "fcfs", False)
    run, _ = _run(trace, 20, cfg, StepModel(10.0))
    assert run.records[0].ttft_ms == 40.0  # 25 x 4 steps


def test_max_model_len_rejects_long_prompts_and_caps_outputs() -> None:
    reqs = [_req(0, 0.0, [1, 2], 100, 50), _req(1, 1.0, [3, 4], 128, 5),
            _req(2, 2.0, [5], 20, 3)]  # fmt: skip
    cfg = SchedulerConfig(None, 8, True, 0, 110, "fcfs", False)
    run, _ = _run(Trace(reqs, 64), 40, cfg, StepModel(10.0))
    x = run.result.extra
    assert (x["rejected_too_long"], x["rejected_too_long_tokens"]) == (1, 128)
    r0, r1, r2 = run.records
    assert r1.finish_order == -1 and r1.cached_tokens == -1
    # request 0 stops at 110 tokens: 10 outputs, 9 decode steps after the prefill
    assert r0.e2e_ms == 100.0 and r2.finish_order == 0


def test_async_scheduling_frees_a_step_late() -> None:
    reqs = [_req(0, 0.0, [1], 48, 3)]
    sync, _ = _run(Trace(reqs, 64), 10, SchedulerConfig(64, 4, True, 0, None, "fcfs", False),
                   StepModel(10.0))  # fmt: skip
    asyn, _ = _run(Trace(reqs, 64), 10, SchedulerConfig(64, 4, True, 0, None, "fcfs", True),
                   StepModel(10.0))  # fmt: skip
    # Same token times, but the async engine needs one step more to drain.
    assert sync.records[0].e2e_ms == asyn.records[0].e2e_ms == 30.0
    assert asyn.result.extra["steps"] == sync.result.extra["steps"] + 1


def test_lookups_count_a_blocked_head_requests_retries() -> None:
    # Request 0 holds most of a 12-block pool for 20 steps; request 1 (same
    # first block) waits, looked up once a step, until it fits.
    reqs = [_req(0, 0.0, [1, 2], 128, 20), _req(1, 5.0, [1, 3], 128, 2)]
    cfg = SchedulerConfig(256, 4, True, 0, None, "fcfs", False)
    run, _ = _run(Trace(reqs, 64), 12, cfg, StepModel(10.0))
    x = run.result.extra
    assert x["prefix_cache_lookups"] > 2
    per_request = run.result.hit_tokens
    assert per_request == 64 == run.records[1].cached_tokens
    assert x["prefix_cache_hits"] == 64 * (x["prefix_cache_lookups"] - 1)
    assert x["prefix_cache_queries"] == 128 * x["prefix_cache_lookups"]
    assert x["request_hit_rate"] == 64 / 256
    assert x["prefix_cache_hit_rate"] != x["request_hit_rate"]


def test_priority_policy_runs_the_lowest_value_first() -> None:
    reqs = [TraceRequest(0, 0.0, 64, 30, (1,)),
            TraceRequest(1, 1.0, 64, 1, (2,), priority=3),
            TraceRequest(2, 2.0, 64, 1, (3,), priority=0)]  # fmt: skip
    # one sequence at a time: 1 and 2 wait for 0; then 2 (priority 0) goes first
    for policy, first in (("fcfs", 1), ("priority", 2)):
        cfg = SchedulerConfig(256, 1, True, 0, None, policy, False)
        run, _ = _run(Trace(reqs, 64), 40, cfg, StepModel(10.0))
        order = sorted(run.records, key=lambda r: r.finish_order)
        assert [r.index for r in order][1] == first


def test_step_model_fit_recovers_the_terms_and_refuses_bad_samples() -> None:
    samples = [[p, d, 5.0 + 0.01 * p + 0.5 * d] for p in (0, 100, 2000) for d in (0, 4, 30)]
    m = fit_step_model(samples)
    assert m.base_ms == pytest.approx(5.0)
    assert m.per_prefill_token_ms == pytest.approx(0.01)
    assert m.per_decode_seq_ms == pytest.approx(0.5)
    assert StepModel.from_json({"samples": samples}) == m
    with pytest.raises(ValueError, match="at least 3"):
        fit_step_model(samples[:2])
    with pytest.raises(ValueError, match="sample 1"):
        fit_step_model([samples[0], [1, 2], samples[2]])
    with pytest.raises(ValueError, match="unknown step model field"):
        StepModel.from_json({"base": 3})
    with pytest.raises(ValueError, match="base_ms must be > 0"):
        StepModel(0.0)
