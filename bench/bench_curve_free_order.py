#!/usr/bin/env python3
"""The one-pass curve under vLLM >= 0.24's free order against vLLM 0.16's, and
the target search, on one trace, in one process.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_curve_free_order.py [TRACE.jsonl] \\
        [--tokens-per-id 512] [--rounds 5] [--target 0.3] [--json OUT]

Without a trace it generates the seeded conversation-like trace of
``bench/trace_bench/conversation.py`` (12,031 requests, the size of
Mooncake's conversation trace).  Sequence mode at 16-token blocks and four
capacities (4096, 8192, 20480, 40960 blocks: 8, 16, 40 and 80 GiB of
Llama-3.1-8B's KV cache per GPU), the whole curve built from the parsed trace
(block naming included) as ``blockpool trace`` does, alternating
``append_all`` and ``uncached_first`` for ``--rounds`` rounds; the figure is
the median of the per-round ratios (uncached_first / append_all: the goal is
at most 1.5).  Then ``--target-hit-rate`` under the default free order
(``smallest_capacity``: the passes and the optimum's bisection), timed once.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.output import write_json
from bench.trace_bench.conversation import write_conversation
from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST
from blockpool.trace import OnePassCurve, read_trace
from blockpool.trace.plan.planner import smallest_capacity
from blockpool.trace.replay.optimal import OptimalCurve

BLOCK_SIZE = 16
BLOCKS = [4096, 8192, 20480, 40960]


def one_curve(trace: Any, free_order: str) -> tuple[float, list[int], int]:
    gc.collect()
    t0 = time.perf_counter()
    curve = OnePassCurve(trace, BLOCK_SIZE, [b * BLOCK_SIZE for b in BLOCKS], free_order)  # type: ignore[arg-type]
    res = curve.run()
    return time.perf_counter() - t0, [r.hit_tokens for r in res], curve.stacks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", type=Path)
    ap.add_argument("--tokens-per-id", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    path = args.trace
    if path is None:
        path = Path(tempfile.mkdtemp()) / "conversation.jsonl"
        write_conversation(path, 7, 12031)
    trace = read_trace(path, args.tokens_per_id)
    rows: dict[str, list[float]] = {APPEND_ALL: [], UNCACHED_FIRST: []}
    ratios = []
    hits: dict[str, list[int]] = {}
    stacks: dict[str, int] = {}
    for i in range(args.rounds):
        order = (APPEND_ALL, UNCACHED_FIRST) if i % 2 == 0 else (UNCACHED_FIRST, APPEND_ALL)
        got = {}
        for fo in order:
            s, hits[fo], stacks[fo] = one_curve(trace, fo)
            got[fo] = s
            rows[fo].append(s)
        ratios.append(got[UNCACHED_FIRST] / got[APPEND_ALL])
        print(f"round {i + 1}: append_all {got[APPEND_ALL]:.2f}s, uncached_first "
              f"{got[UNCACHED_FIRST]:.2f}s, ratio {ratios[-1]:.2f}", flush=True)  # fmt: skip
    ratio = statistics.median(ratios)
    print(f"{path.name}: {len(trace)} requests, {len(BLOCKS)} capacities {BLOCKS} blocks")
    for fo in (APPEND_ALL, UNCACHED_FIRST):
        rates = ", ".join(f"{100 * h / trace.prompt_tokens:.2f}%" for h in hits[fo])
        print(f"  {fo:<15} median {statistics.median(rows[fo]):.2f}s  "
              f"stacks {stacks[fo]}  LRU {rates}")  # fmt: skip
    print(f"  uncached_first / append_all: median ratio {ratio:.2f} (goal <= 1.5)")
    t0 = time.perf_counter()
    opt = OptimalCurve(trace, BLOCK_SIZE)
    ans = smallest_capacity(trace, BLOCK_SIZE, args.target, opt, free_order=UNCACHED_FIRST)
    target_s = time.perf_counter() - t0
    print(f"  target {args.target:.0%} (uncached_first): LRU {ans.lru_blocks} blocks, "
          f"optimal {ans.optimal_blocks} blocks, {target_s:.1f}s (optimum included)")  # fmt: skip
    if args.json:
        write_json(args.json, {
            "trace": str(path), "requests": len(trace), "blocks": BLOCKS,
            "seconds": rows, "ratios": ratios, "median_ratio": ratio,
            "target": args.target, "target_lru_blocks": ans.lru_blocks,
            "target_optimal_blocks": ans.optimal_blocks, "target_seconds": target_s,
        })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
