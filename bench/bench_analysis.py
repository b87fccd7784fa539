#!/usr/bin/env python3
"""bench_analysis.py -- what do miss reasons, regret, shadow pools and the
recording cost the engine?

One seeded serving-like workload (block size 16; chats over 4 shared system
prompts, multi-turn conversations whose prompt is the whole history so far,
questions over 8 long shared documents, some LoRA / cache-salt traffic, noise;
4-16 decode tokens per step; finish) is applied to a fresh metadata-only
engine through ``Engine.apply`` -- the path every REST call and the demo
take -- with ``tick()`` called at 20 Hz of elapsed time, as the service does.
The pool is small enough that cached blocks are evicted all the time.

Variants, each run in every round (rounds interleave the variants so that a
noisy machine hits them alike):

* ``off``        analysis off (the engine as it was).
* ``on``         the analysis on, as the service runs it (analysis_mode
                 "worker"): the engine records every operation (keyframes
                 included) and sends the records to the worker process, whose
                 replica computes miss reasons, regret, queue travel and three
                 vLLM 0.16 shadow pools (0.5x, 2x, 4x).
* ``on+1x``      the service's default shadows: also vLLM 0.16, uncached-first
                 and S3-FIFO at 1x (six; the engine's cost does not change).
* ``inline``     analysis_mode "inline": the hooks on the engine (exact and
                 synchronous), the three shadows in the worker process.
* ``inline-sh``  as ``inline`` with the shadows applied on the engine at tick
                 time (what the worker process saves).
* ``rec-only``   the recording and the replica, no shadows.

Reports operations/s (best of --reps and median), the ratio to ``off``
(goal: ``on`` >= 0.9x), the engine-side analysis time per tick, and after each
run the worker's lag at the end and how long it took to catch up (the
replica does the engine's work again plus the analysis, on another core: at
full saturation it finishes after the engine).  Prints a table and writes JSON
(--json, default bench/results/analysis.json).  Not a test.

    python bench/bench_analysis.py [--ops 20000] [--reps 5] [--blocks 8192]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.pool.engine import Engine  # noqa: E402
from app.pool.schemas import AdmitOp, AppendOp, FinishOp  # noqa: E402
from app.shared.errors import OperationError  # noqa: E402
from app.shared.settings import Settings  # noqa: E402

VOCAB = 32_000
BS = 16
TICK_S = 0.05


def make_ops(seed: int, n_ops: int, max_running: int) -> list[Any]:
    """A scheduler-like op stream: admit, decode steps, finish."""
    rng = random.Random(seed)

    def toks(k: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(k)]

    systems = [toks(rng.randint(150, 600)) for _ in range(4)]
    docs = [toks(rng.randint(800, 2500)) for _ in range(8)]
    convs: list[list[int]] = [[] for _ in range(24)]
    busy: set[int] = set()
    running: dict[str, tuple[int, int | None, list[int]]] = {}
    ops: list[Any] = []
    seq = 0
    while len(ops) < n_ops:
        if len(running) < max_running and rng.random() < 0.5:
            seq += 1
            rid = f"b{seq}"
            kind = rng.random()
            conv = None
            extra: dict[str, Any] = {}
            if kind < 0.35:
                prompt = rng.choice(systems) + toks(rng.randint(20, 200))
                if rng.random() < 0.15:
                    extra = {"cache_salt": f"tenant-{rng.randrange(3)}"}
            elif kind < 0.6:
                free = [i for i in range(len(convs)) if i not in busy]
                if not free:
                    continue
                conv = rng.choice(free)
                hist = convs[conv]
                if len(hist) > 6000:
                    hist.clear()
                if not hist:
                    hist.extend(rng.choice(systems))
                hist.extend(toks(rng.randint(20, 120)))
                prompt = list(hist)
                busy.add(conv)
            elif kind < 0.85:
                prompt = rng.choice(docs) + toks(rng.randint(10, 60))
                if rng.random() < 0.2:
                    extra = {"lora_name": "adapter-a"}
            else:
                prompt = toks(rng.randint(100, 1000))
            ops.append(AdmitOp(request_id=rid, token_ids=prompt, **extra))
            running[rid] = (rng.randint(16, 160), conv, [])
        elif running:
            rid = rng.choice(list(running))
            left, conv, out = running[rid]
            if left <= 0:
                ops.append(FinishOp(request_id=rid))
                del running[rid]
                if conv is not None:
                    convs[conv].extend(out)
                    busy.discard(conv)
                continue
            t = toks(min(left, rng.randint(4, 16)))
            out.extend(t)
            running[rid] = (left - len(t), conv, out)
            ops.append(AppendOp(request_id=rid, token_ids=t))
    ops.extend(FinishOp(request_id=rid) for rid in running)
    return ops


THREE = {"shadow_factors": [0.5, 2.0, 4.0], "shadow_policies": []}
VARIANTS: dict[str, dict[str, Any]] = {
    "off": {"analysis": False},
    "on": {"analysis": True, "analysis_mode": "worker", **THREE},
    "on+1x": {"analysis": True, "analysis_mode": "worker"},
    "inline": {"analysis": True, "analysis_mode": "inline", "shadow_mode": "process", **THREE},
    "inline-sh": {"analysis": True, "analysis_mode": "inline", "shadow_mode": "inline", **THREE},
    "rec-only": {"analysis": True, "analysis_mode": "worker", "shadow_mode": "off", **THREE},
}


def catch_up(
    shadows: Any, timeout_s: float, hit_rates: Callable[[], dict[str, float]]
) -> dict[str, Any]:
    """The shadows' lag when the load stops, how long they take to catch up
    (``wait_idle``), their drops and resyncs, and then their hit rates."""
    lag_at_end = shadows.outstanding
    t1 = time.perf_counter()
    caught_up = shadows.wait_idle(timeout_s)
    return {
        "lag_at_end": lag_at_end,
        "catch_up_s": time.perf_counter() - t1,
        "caught_up": caught_up,
        "dropped": shadows.dropped,
        "resyncs": shadows.resyncs,
        "hit_rates": hit_rates(),
    }


def run(variant: str, ops: list[Any], blocks: int) -> dict[str, Any]:
    settings = Settings(
        num_blocks=blocks,
        block_size=BS,
        storage=False,
        hash_fn="sha256",
        **VARIANTS[variant],
    )
    engine = Engine(settings)
    an = engine.analysis
    if an is not None:
        an.start()
        if an.feeder is not None and an.feeder.mode == "process":
            an.feeder.wait_idle(60)  # the worker is up (not timed)
        if an.remote is not None:
            an.remote.wait_idle(60)
    gc.collect()
    refused = 0
    apply = engine.apply
    clock = time.perf_counter
    ticks = 0
    t0 = clock()
    next_tick = t0 + TICK_S
    for op in ops:
        try:
            apply(op)
        except OperationError:
            refused += 1
        if clock() >= next_tick:
            engine.tick()
            ticks += 1
            next_tick += TICK_S
    engine.tick()
    elapsed = clock() - t0
    out: dict[str, Any] = {
        "variant": variant,
        "ops": len(ops),
        "refused": refused,
        "seconds": elapsed,
        "ops_per_s": len(ops) / elapsed,
        "ticks": ticks + 1,
        "evictions": engine.counters.evictions,
        "hit_rate": engine.manager.stats.hit_rate,
    }
    if an is not None:
        out["analysis_tick_ms"] = 1e3 * an.tick_seconds / (ticks + 1)
        out["regrets"] = an.misses.regret.regrets if an.local else None
        if an.recorder is not None:
            out["recorded_ops"] = an.recorder.ops
            out["keyframes"] = an.recorder.keyframes_taken
            out["keyframe_ms"] = (
                1e3 * an.recorder.keyframe_seconds / max(1, an.recorder.keyframes_taken)
            )
        f = an.feeder
        if f is not None:
            out["shadow"] = catch_up(
                f, 120, lambda: {s["name"]: round(s["hit_rate"], 4) for s in (f.latest or [])}
            )
        r = an.remote
        if r is not None:
            out["shadow"] = catch_up(
                r,
                300,
                lambda: {
                    f"{p}@{x:g}x": round(h, 4)
                    for p, x, h, *_ in (r.prom or {}).get("shadows") or []
                },
            )
        an.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--max-running", type=int, default=48)
    ap.add_argument(
        "--variants", nargs="+", default=["off", "on", "on+1x", "inline"], choices=list(VARIANTS)
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "analysis.json"))
    args = ap.parse_args()
    ops = make_ops(args.seed, args.ops, args.max_running)
    print(f"workload: {len(ops)} ops, pool {args.blocks} blocks of {BS}, {os.cpu_count()} CPUs")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    for rep in range(args.reps):
        order = args.variants if rep % 2 == 0 else args.variants[::-1]
        for v in order:
            r = run(v, ops, args.blocks)
            runs[v].append(r)
            print(f"  round {rep + 1} {v:7s} {r['ops_per_s']:9.0f} ops/s", flush=True)
    base = max(r["ops_per_s"] for r in runs.get("off", [])) if "off" in runs else None
    base_med = statistics.median(r["ops_per_s"] for r in runs["off"]) if "off" in runs else None
    print()
    print(f"{'variant':8s} {'best ops/s':>11s} {'median':>9s} {'x off':>7s} {'x off med':>9s} "
          f"{'tick ms':>8s} {'keyframe ms':>11s} {'shadow lag/caught up':>22s}")  # fmt: skip
    summary: dict[str, Any] = {}
    for v, rs in runs.items():
        best = max(r["ops_per_s"] for r in rs)
        med = statistics.median(r["ops_per_s"] for r in rs)
        last = rs[-1]
        sh = last.get("shadow")
        lag = f"{sh['lag_at_end']}/{sh['caught_up']}" if sh else "-"
        ratio = best / base if base else float("nan")
        ratio_med = med / base_med if base_med else float("nan")
        tick = last.get("analysis_tick_ms")
        kf = last.get("keyframe_ms")
        print(
            f"{v:8s} {best:11.0f} {med:9.0f} {ratio:7.3f} {ratio_med:9.3f} "
            f"{(f'{tick:.2f}' if tick is not None else '-'):>8s} "
            f"{(f'{kf:.1f}' if kf is not None else '-'):>11s} {lag:>22s}"
        )
        summary[v] = {"best_ops_per_s": best, "median_ops_per_s": med, "x_off_best": ratio,
                      "x_off_median": ratio_med}  # fmt: skip
    if "on" in runs:
        sh = runs["on"][-1].get("shadow", {})
        print(f"\nshadow hit rates (last 'on' run): {sh.get('hit_rates')}")
        print(f"real hit rate: {runs['on'][-1]['hit_rate']:.4f}")
    result = {
        "bench": "analysis",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "workload": {
            "ops": len(ops),
            "blocks": args.blocks,
            "block_size": BS,
            "seed": args.seed,
            "max_running": args.max_running,
        },
        "summary": summary,
        "goal": "on >= 0.9 x off",
        "runs": runs,
    }
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
