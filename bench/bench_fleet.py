"""A fleet sweep's time against the number of workers, in one run.

    python bench/bench_fleet.py TRACE.jsonl [--requests N] [--workers 1,2]
        [--ray] [--json OUT]

The sweep: replicas 1,2,4 x capacity per replica (two sizes) x the four
routers, sequence mode, 16-token blocks, on the first ``--requests`` of the
trace.  Timed: the serial sweep (in this process; the baseline), then on
local processes with each ``--workers`` count, then (``--ray``) as Ray
tasks on a local Ray with the largest count.  Every parallel run must give
the serial run's results exactly (checked); the figures are the seconds and
the speed-up against the serial run of the same invocation.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.output import write_json
from blockpool.trace import read_trace
from blockpool.trace.fleet import ROUTERS, FleetJob, FleetSpec, run_sweep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--capacities", default="20000,60000", help="blocks per replica")
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    trace = read_trace(args.trace, 512)
    trace.requests = trace.requests[: args.requests]
    spec = FleetSpec(block_size=16)
    caps = [int(c) for c in args.capacities.split(",")]
    jobs = [
        FleetJob(n, str(c), c, r, "append_all") for n in (1, 2, 4) for c in caps for r in ROUTERS
    ]
    print(f"{len(jobs)} configurations, {len(trace)} requests, {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    serial = run_sweep(trace, spec, jobs, executor="serial")
    base = time.perf_counter() - t0
    want = [r.to_json() for r in serial]
    runs: list[dict[str, Any]] = [{"executor": "serial", "workers": 1, "seconds": base}]
    print(f"serial: {base:.1f}s")
    counts = [int(w) for w in args.workers.split(",")]
    plan = [("process", w) for w in counts] + ([("ray", max(counts))] if args.ray else [])
    for ex, w in plan:
        t0 = time.perf_counter()
        got = run_sweep(trace, spec, jobs, executor=ex, workers=w)
        dt = time.perf_counter() - t0
        same = [r.to_json() for r in got] == want
        if not same:
            print(f"{ex} x{w}: results differ from the serial run", file=sys.stderr)
            return 1
        runs.append({"executor": ex, "workers": w, "seconds": dt, "speedup": base / dt})
        print(f"{ex} x{w}: {dt:.1f}s, {base / dt:.2f}x the serial run (results equal)")
    if args.json:
        write_json(args.json, {"configurations": len(jobs), "requests": len(trace), "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
