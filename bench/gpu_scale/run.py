"""What the blockpool vLLM plugin costs a GPU-sized engine, measured without a GPU.

vLLM's real scheduler (bench/gpu_scale/engine.py) runs twice over the same
seeded request stream (bench/gpu_scale/workload.py) for the same number of
steps: plain (vLLM's class) and with the plugin (blockpool_vllm's subclass,
``BLOCKPOOL_MIRROR_ENDPOINT`` on a free loopback port; nobody subscribed
unless ``--subscriber``).  Each run is a process of its own (its own heap and
garbage collector).  A warm-up (not measured) first fills the pool
until it evicts; then ``--steps`` measured steps with a ``--sleep-ms`` forward
pass.  The warm-up has the same forward pass (``--warmup-sleep-ms``), as an
engine's first steps do: the plugin follows from the first step, as in an
engine.  ``--warmup-sleep-ms 0`` fills the pool faster and leaves the
plugin's digest far behind (no pass to read in), rebuilt by a sweep in the
settling steps and, if they are too few, the measured ones: its cost is then
part of the figures (``plugin reports``: ``sweep_rows_left``).

Reported per step: p50 / p99 / max of the scheduler's own time, the time the
plugin adds at each percentile, steps/s (the sleep included) and its
ratio, garbage collections, pool usage and evictions, and whether both runs
scheduled exactly the same tokens and finished the same requests.

    python -m bench.gpu_scale.run [--scheduler sync|async|both] [--num-blocks 524288]
        [--steps 300] [--sleep-ms 6] [--trace mooncake.jsonl] [--subscriber] [--json PATH]

Load generator for a mirror (``blockpool serve --mirror ENDPOINT``):

    python -m bench.gpu_scale.run --publish-only --endpoint tcp://127.0.0.1:5590 \\
        --steps-per-s 200 --duration 30

Run with a vLLM environment's python (``make bench-gpu``), from the repository
root (or with it on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.gpu_scale.args import add_forward_options, non_negative, positive, positive_int  # noqa: E402
from bench.gpu_scale.children import (  # noqa: E402
    child_argv,
    free_port_pair,
    spawn,
    start_subscriber,
    stop_subscriber,
)
from bench.gpu_scale.engine import (  # noqa: E402
    Driver,
    Shape,
    build_scheduler,
    vllm_version,
)
from bench.gpu_scale.plugin_report import plugin_reported, settled_digest  # noqa: E402
from bench.gpu_scale.report import GOALS, compare, table  # noqa: E402
from bench.gpu_scale.step_records import GcClock, Steps  # noqa: E402
from bench.gpu_scale.workload import TraceWorkload, Workload  # noqa: E402

# ------------------------------------------------------------------ helpers


def shape_of(args: argparse.Namespace, async_sched: bool) -> Shape:
    return Shape(
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=args.max_model_len,
        async_sched=async_sched,
    )


def workload_of(args: argparse.Namespace) -> Any:
    max_prompt = min(args.max_prompt, args.max_model_len - 512)
    if args.trace:
        return TraceWorkload(Path(args.trace), args.seed, max_prompt=max_prompt)
    return Workload(args.seed, max_prompt=max_prompt, min_prompt=args.min_prompt)


# ------------------------------------------------------------- one variant


def run_variant(args: argparse.Namespace) -> dict[str, Any]:
    """One run (in this process): warm-up, then the measured steps."""
    plugin = args.child == "plugin"
    shape = shape_of(args, args.child_async)
    with tempfile.TemporaryDirectory(prefix="gpu-scale-") as tmp:
        t0 = time.perf_counter()
        sched = build_scheduler(shape, Path(tmp), plugin=plugin, endpoint=args.endpoint)
        built_s = time.perf_counter() - t0
        # as vLLM's EngineCore does once built (vllm.utils.gc_utils.freeze_gc_heap):
        # what start-up made (the pool's blocks, the plugin's tables) is never
        # walked by the garbage collector again
        gc.collect()
        gc.freeze()
        driver = Driver(sched, workload_of(args), shape, args.concurrency or shape.max_num_seqs)
        driver.forward_s_per_token = args.forward_us_per_token / 1e6
        # warm-up: not measured, until the pool evicts (auto) or N steps
        t0 = time.perf_counter()
        driver.output_cap = args.warmup_max_tokens
        warm = (args.sleep_ms if args.warmup_sleep_ms is None else args.warmup_sleep_ms) / 1e3
        if args.warmup == "auto":
            while driver.evictions == 0 and driver.steps_run < args.max_warmup:
                driver.step(warm, None, None)
            for _ in range(args.warmup_extra):
                driver.step(warm, None, None)
        else:
            for _ in range(int(args.warmup)):
                driver.step(warm, None, None)
        driver.output_cap = 0
        warm_steps = driver.steps_run  # (the other variant's --warmup: the settling is its own)
        # then steps at the engine's pace (the forward pass included), not
        # measured either: what a plugin left for its thread during the quick
        # steps above (no forward pass: it had no time of its own) is done
        for _ in range(args.settle_steps):
            driver.step(args.sleep_ms / 1e3, None, None)
        warm_s = time.perf_counter() - t0
        facts_before = driver.pool_facts()
        outcome_before = driver.outcome()
        reported_before = plugin_reported(sched) if plugin else {}
        gc.collect()
        rec = Steps()
        forward = args.sleep_ms / 1e3
        with GcClock() as clock:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                driver.step(forward, rec, clock)
            measured_s = time.perf_counter() - t0
        reported = plugin_reported(sched) if plugin else {}
        digest_check = settled_digest(sched)  # (after: the engine idle, then O(pool))
        doc = {
            "variant": args.child,
            "scheduler": type(sched).__name__,
            "vllm": vllm_version(),
            "pid": os.getpid(),
            "build_s": round(built_s, 2),
            "warmup_steps": warm_steps,
            "warmup_s": round(warm_s, 2),
            "measured_s": round(measured_s, 3),
            "pool_before": facts_before,
            "pool_after": driver.pool_facts(),
            "outcome_before": outcome_before,
            "outcome": driver.outcome(),
            "workload": driver.workload.summary(),
            "gc": clock.summary(),
            "gc_thresholds": list(gc.get_threshold()),
            "gc_tracked_objects": len(gc.get_objects()),
            "steps": rec.__dict__,
            "plugin_reported": reported,
            "plugin_reported_before": reported_before,
            "digest_check": digest_check,
        }
        sched.shutdown()
        return doc


# ---------------------------------------------------------- orchestration


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    kinds = {"sync": [False], "async": [True], "both": [False, True]}[args.scheduler]
    comparisons = []
    version = ""
    with tempfile.TemporaryDirectory(prefix="gpu-scale-out-") as tmp:
        for async_sched in kinds:
            warmup = args.warmup
            plain: list[dict[str, Any]] = []
            plugin: list[dict[str, Any]] = []
            for rnd in range(args.rounds):
                order = ["plain", "plugin"] if rnd % 2 == 0 else ["plugin", "plain"]
                if warmup == "auto" and order[0] == "plugin":
                    order = ["plain", "plugin"]
                for variant in order:
                    endpoint = f"tcp://127.0.0.1:{free_port_pair()}"
                    # (--aa: the "plugin" run is plain too -- the bench's own spread)
                    run_as = "plain" if args.aa else variant
                    sub = None
                    if run_as == "plugin" and args.subscriber:
                        sub = start_subscriber(endpoint)
                    out = Path(tmp) / f"{variant}-{int(async_sched)}-{rnd}.json"
                    argv = child_argv(args, run_as, async_sched, warmup)
                    kind = "async" if async_sched else "sync"
                    sys.stderr.write(f"running {variant} ({kind}{', as plain' * args.aa})\n")
                    doc = spawn(argv, endpoint, out, args.digest_on_engine)
                    if sub is not None:
                        doc["subscriber"] = stop_subscriber(sub)
                    # the plugin run warms up exactly as long as the plain one did
                    warmup = str(doc["warmup_steps"])
                    version = doc["vllm"]
                    (plain if variant == "plain" else plugin).append(doc)
            comparisons.append(compare("async" if async_sched else "sync", plain, plugin))
    config = {
        k: getattr(args, k)
        for k in (
            "num_blocks",
            "block_size",
            "max_num_seqs",
            "max_batched_tokens",
            "max_model_len",
            "steps",
            "sleep_ms",
            "forward_us_per_token",
            "warmup_sleep_ms",
            "seed",
            "rounds",
            "trace",
            "concurrency",
            "min_prompt",
            "max_prompt",
            "subscriber",
            "digest_on_engine",
            "aa",
        )
    }
    return {
        "bench": "gpu_scale",
        "vllm": version,
        "python": sys.version.split()[0],
        "config": config,
        "goals": GOALS,
        "load_avg": list(os.getloadavg()),
        "comparisons": comparisons,
    }


# ------------------------------------------------------------ publish only


def publish_only(args: argparse.Namespace) -> None:
    """The plugin's scheduler at ``--steps-per-s`` for ``--duration`` s, on
    ``--endpoint``, for a mirror to follow."""
    endpoint = args.endpoint or f"tcp://127.0.0.1:{free_port_pair()}"
    shape = shape_of(args, args.scheduler == "async")
    with tempfile.TemporaryDirectory(prefix="gpu-scale-pub-") as tmp:
        sched = build_scheduler(shape, Path(tmp), plugin=True, endpoint=endpoint)
        driver = Driver(sched, workload_of(args), shape, args.concurrency or shape.max_num_seqs)
        print(
            f"publishing on {endpoint}: {args.steps_per_s} steps/s for {args.duration} s",
            flush=True,
        )
        period = 1.0 / args.steps_per_s
        start = time.perf_counter()
        due = start
        last_note = start
        late = 0
        while (now := time.perf_counter()) - start < args.duration:
            driver.step(0.0, None, None)
            due += period
            rest = due - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
            else:
                late += 1
                due = time.perf_counter()  # behind: do not try to catch up in a burst
            if now - last_note >= 5:
                last_note = now
                f = driver.pool_facts()
                print(
                    f"  {driver.steps_run} steps, {driver.steps_run / (now - start):.0f}/s, "
                    f"usage {f['usage_now']:.3f}, evictions {f['evictions']:,}",
                    flush=True,
                )
        took = time.perf_counter() - start
        doc = {
            "endpoint": endpoint,
            "steps": driver.steps_run,
            "steps_per_s": round(driver.steps_run / took, 1),
            "late_steps": late,
            "pool": driver.pool_facts(),
            "outcome": driver.outcome(),
            "plugin_reported": plugin_reported(sched),
        }
        sched.shutdown()
    print(json.dumps(doc), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")


# --------------------------------------------------------------------- CLI


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scheduler", choices=["sync", "async", "both"], default="sync")
    p.add_argument("--num-blocks", type=positive_int, default=524_288)
    p.add_argument("--block-size", type=positive_int, default=16)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--max-batched-tokens", type=positive_int, default=8192)
    p.add_argument("--max-model-len", type=positive_int, default=16_384)
    p.add_argument(
        "--concurrency",
        type=int,
        default=0,
        help="requests kept in the engine (default: max-num-seqs)",
    )
    p.add_argument("--steps", type=positive_int, default=300, help="measured steps per variant")
    p.add_argument("--warmup", default="auto", help="warm-up steps, or auto: until the pool evicts")
    p.add_argument("--max-warmup", type=int, default=20_000)
    p.add_argument(
        "--warmup-extra", type=int, default=20, help="steps after the first eviction (auto)"
    )
    p.add_argument(
        "--warmup-max-tokens",
        type=int,
        default=16,
        help="outputs cut to this many tokens in the warm-up (0: as planned)",
    )
    p.add_argument("--sleep-ms", type=non_negative, default=6.0, help="the forward pass stand-in")
    add_forward_options(p)
    p.add_argument(
        "--warmup-sleep-ms",
        type=non_negative,
        default=None,
        help="the warm-up's forward pass (default: --sleep-ms; 0: a quicker warm-up "
        "that leaves the plugin's digest behind, rebuilt by a sweep after it)",
    )
    p.add_argument(
        "--settle-steps",
        type=int,
        default=400,
        help="steps with the forward pass after the warm-up, before the measured ones "
        "(after --warmup-sleep-ms 0: the plugin's digest rebuilt meanwhile, if they suffice)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-prompt", type=int, default=1024)
    p.add_argument("--max-prompt", type=int, default=8192)
    p.add_argument("--trace", help="a Mooncake JSONL trace instead of the conversations")
    p.add_argument(
        "--rounds", type=positive_int, default=1, help="plain/plugin pairs (order alternates)"
    )
    p.add_argument(
        "--subscriber",
        action="store_true",
        help="drain the plugin's stream with a SUB socket in a subprocess",
    )
    p.add_argument(
        "--digest-on-engine",
        action="store_true",
        help="the plugin with BLOCKPOOL_MIRROR_DEFER_DIGEST=0 (its digest on the engine's thread)",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="A/A: the plugin's runs plain too -- what the bench reads with no plugin at all "
        "(two processes' heaps differ; read a plugin run against one of the same hour)",
    )
    p.add_argument("--json", help="write every figure here")
    p.add_argument(
        "--publish-only",
        action="store_true",
        help="only run the plugin's scheduler, paced, for a mirror",
    )
    p.add_argument("--endpoint", default="", help="the plugin's PUB endpoint")
    p.add_argument("--steps-per-s", type=positive, default=200.0)
    p.add_argument("--duration", type=positive, default=30.0)
    p.add_argument("--child", choices=["plain", "plugin"], help=argparse.SUPPRESS)
    p.add_argument("--child-async", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        doc = run_variant(args)
        Path(args.child_out).write_text(json.dumps(doc))
        return 0
    if args.publish_only:
        publish_only(args)
        return 0
    doc = orchestrate(args)
    print(table(doc))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
