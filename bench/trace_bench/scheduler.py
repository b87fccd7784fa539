"""``bench_trace.py scheduler``: timed mode's scheduler model against vLLM
0.16.0's real ``AsyncScheduler``/``Scheduler`` on the same trace, in one
process (the 0.16.0 venv), alternating rounds; both loops are timed alone
(trace parsing, vLLM's start-up and the comparison are not counted).  The
per-request outcomes (cached prefix at first schedule, preemptions,
completion order) must be equal.  ``--groups full,sliding:4096``: both
sides on those KV-cache groups (``GroupSlots`` against vLLM's hybrid
``KVCacheConfig``)."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parity import sched016


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", type=Path)
    p.add_argument("--requests", type=int, default=1000, help="the first N (0: all)")
    p.add_argument("--capacity-tokens", type=int, default=100_000)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=40960)
    p.add_argument("--sync", action="store_true", help="synchronous scheduling")
    p.add_argument("--groups", default="", help="KV-cache groups: full,sliding:TOKENS,...")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hf-home", type=Path, default=Path("/tmp/blockpool-sched-hf"))
    p.add_argument("--profile", action="store_true", help="cProfile our side once after")
    p.add_argument("--json", type=Path, help="write the figures here")


def _ours(args: argparse.Namespace, trace: Any) -> tuple[float, Any]:
    from blockpool import BlockPool, init_none_hash, sha256
    from blockpool.trace.replay.results import CapacityResult
    from blockpool.trace.sched.group_slots import parse_groups
    from blockpool.trace.sched.scheduled import run_scheduled
    from blockpool.trace.sched.scheduler import SchedulerConfig

    init_none_hash(sha256)
    blocks = args.capacity_tokens // 16
    cfg = SchedulerConfig(args.max_num_batched_tokens, 256, True, 0, args.max_model_len,
                          "fcfs", not args.sync)  # fmt: skip
    pool = BlockPool(blocks, True, 16, False)
    res = CapacityResult(args.capacity_tokens, blocks)
    groups = parse_groups(args.groups, 16) if args.groups else ()
    gc.collect()
    t0 = time.process_time()
    run = run_scheduled(
        trace, pool, 16, sha256, res, cfg, speed=args.speed, records=True, groups=groups
    )
    return time.process_time() - t0, run


def bench_scheduler(args: argparse.Namespace) -> dict[str, Any]:
    from blockpool.trace import read_trace
    from blockpool.trace.workload.reader import Trace

    sched016.write_hf_cache(args.hf_home)
    sched016.setup_offline(str(args.hf_home))
    trace = read_trace(args.trace)
    if args.requests:
        trace = Trace(trace.requests[: args.requests], trace.tokens_per_id)
    vargs = sched016.parse_args([
        str(args.trace), "--num-blocks", str(args.capacity_tokens // 16),
        "--max-num-batched-tokens", str(args.max_num_batched_tokens),
        "--max-model-len", str(args.max_model_len), "--speed", str(args.speed),
        "--hf-home", str(args.hf_home), *(["--sync"] if args.sync else []),
        *(["--groups", args.groups] if args.groups else []),
    ])  # fmt: skip
    t_ours: list[float] = []
    t_vllm: list[float] = []
    run: Any = None
    doc: dict[str, Any] = {}
    for i in range(args.rounds):
        for side in ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours"):
            if side == "ours":
                dt, run = _ours(args, trace)
                t_ours.append(dt)
            else:
                gc.collect()
                doc = sched016.run(vargs, trace)
                t_vllm.append(doc["cpu_seconds"])
    recs = {str(r.index): r for r in run.records}
    order = sorted((r for r in run.records if r.finish_order >= 0), key=lambda r: r.finish_order)
    same = (
        all(recs[k].cached_tokens == v for k, v in doc["cached"].items())
        and all(recs[k].preemptions == v for k, v in doc["preemptions"].items())
        and [str(r.index) for r in order] == doc["finished"]
    )
    o, v = min(t_ours), min(t_vllm)
    out = {
        "requests": len(trace),
        "capacity_tokens": args.capacity_tokens,
        "async_scheduling": not args.sync,
        "kv_cache_groups": args.groups or "full",
        "preemptions": run.result.preemptions,
        "identical": same,
        "cpu_seconds_ours": t_ours,
        "cpu_seconds_vllm": t_vllm,
        "ratio": v / o,
    }
    print(
        f"{len(trace)} requests, {args.capacity_tokens} tokens, "
        f"{'sync' if args.sync else 'async'}, groups {args.groups or 'full'}: "
        f"{run.result.preemptions} preemptions; "
        f"same per request: {same}; best of {args.rounds} (CPU s): ours {o:.2f}, "
        f"vLLM 0.16.0 Scheduler {v:.2f}: ours {v / o:.2f}x"
    )
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        _ours(args, trace)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return out
