"""Production-trace benchmarks against vLLM 0.16.0, in one process.

    /tmp/vllm016/bin/python bench/bench_trace.py curve TRACE.jsonl [--json OUT]
    /tmp/vllm016/bin/python bench/bench_trace.py requests TRACE.jsonl [--json OUT]
    /tmp/vllm016/bin/python bench/bench_trace.py groups TRACE.jsonl [--layouts gemma3,sliding]

(the venv of ``vllm016_setup.sh``; the trace path is required.)

``curve`` -- the hit-rate curve.  Sequence mode at 16-token blocks and five
capacities: the one-pass curve and vLLM 0.16.0's own BlockPool (five pools
driven in one loop by ``SequenceDriver``, events on to count evictions) must
give the same hit tokens, evictions and refusals at every capacity (our own
pool is held to the curve by tests/trace).  Then timed, alternating, several
rounds: the whole five-point one-pass curve (from the parsed trace: block
naming included) against ONE unbounded replay on vLLM's pool (and on ours),
given the block hashes ready-made (hashing and pool construction are not
counted on the pools' side).

``scheduler`` -- timed mode's vLLM scheduler model against vLLM 0.16.0's
real ``AsyncScheduler`` (``--sync``: ``Scheduler``) on the same trace
(bench/trace_bench/scheduler.py).

``groups`` -- sequence mode over KV-cache groups (a sliding window, full
attention with windows: ``--layouts gemma3,gpt-oss,sliding,full+two``) at
one pool size: our coordinator (``GroupSequenceDriver``) against vLLM
0.16.0's own ``KVCacheManager`` with the same groups, alternating, the
requests built and hashed outside the timing on both sides; per request the
hit tokens and refusals must be equal (bench/trace_bench/groups.py).

``requests`` --  A timed replay of the trace (vLLM's scheduler with every
feature off, ``blockpool.trace.sched.timed.simple_scheduler``) is run once on our
RequestManager and its calls
recorded (admit with the prompt, one append per decode token, finish); the
same calls are then replayed, alternating A/B, on our RequestManager and on
vLLM 0.16.0's KVCacheManager driven as its own tests drive it
(``Request`` with a block hasher, ``get_computed_blocks``, ``allocate_slots``,
``free``; one full-attention group, no GPU).  Both must give the same hit
count at every admission and fail the same appends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_bench.curve import bench_curve
from trace_bench.groups import add_arguments as add_groups_bench
from trace_bench.groups import bench_groups
from trace_bench.requests import bench_requests
from trace_bench.scheduler import add_arguments as add_scheduler_bench
from trace_bench.scheduler import bench_scheduler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    c = sub.add_parser("curve", help="the hit-rate curve against vLLM 0.16.0's pool")
    c.add_argument("trace", type=Path)
    c.add_argument("--rounds", type=int, default=3)
    c.add_argument("--no-check", action="store_true", help="timing only (no vLLM pools check)")
    c.add_argument("--json", type=Path, help="write the figures here")
    r = sub.add_parser("requests", help="request level: RequestManager vs KVCacheManager")
    r.add_argument("trace", type=Path)
    r.add_argument("--capacity-tokens", type=int, default=1 << 20)
    r.add_argument("--speed", type=float, default=1.0)
    r.add_argument("--requests", type=int, default=0, help="only the first N (0: all)")
    r.add_argument("--window", type=int, default=100, help="admissions per A/B window")
    r.add_argument("--profile", action="store_true", help="cProfile both sides after")
    r.add_argument("--json", type=Path, help="write the figures here")
    add_scheduler_bench(sub.add_parser("scheduler", help="timed mode vs vLLM's Scheduler"))
    add_groups_bench(sub.add_parser("groups", help="KV-cache groups vs vLLM's KVCacheManager"))
    args = ap.parse_args(argv)
    benches = {"curve": bench_curve, "requests": bench_requests, "scheduler": bench_scheduler,
               "groups": bench_groups}  # fmt: skip
    out = benches[args.what](args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if out.get("identical") is False else 0


if __name__ == "__main__":
    sys.exit(main())
