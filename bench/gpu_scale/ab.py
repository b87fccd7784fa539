"""The plugin's cost on the engine's thread, measured in one process.

``bench.gpu_scale.run`` compares two processes, plain vLLM and the plugin's
scheduler: the fairest comparison an operator can make, but two heaps laid
out differently, on a shared 2-core machine, differ by a few tenths of a
millisecond a step between runs of the *same* variant.  This bench removes
that: one ``MirrorScheduler`` (or ``MirrorAsyncScheduler``), one request
stream, and blocks of ``--block`` steps that alternate (ABBA) between

* **on**: the plugin as it runs in an engine (its hooks, the pool's calls
  followed, its thread sending and digesting in the forward passes), and
* **off**: vLLM's own methods called directly and the pool's unwrapped --
  the plugin's thread still there, with nothing to do.

Per step: the engine thread's CPU time in ``add_request`` + ``schedule`` +
``update_from_output`` (``thread_time``: not the time it waited for the
interpreter or a core), their wall time, the whole step, and the garbage
collector's time.  The pool moves on while the plugin is off, unfollowed:
each on block starts from the plugin's digest made the pool's again, outside
the measured steps (``Switch.fresh_digest``), and after the last block one
more on block runs and the digest is checked against vLLM's pool from
scratch.

The two modes' blocks are other steps of the stream (the same ones in every
run with the same options: at ``--rounds 30`` the on blocks schedule 7 %
more tokens), and their ratio carries that: ``--aa`` keeps the plugin off in
both modes (what the bench reads with no difference), ``--first on`` swaps
the blocks, and ``bench.gpu_scale.crossover`` runs both and pairs each step
with itself.

    python -m bench.gpu_scale.ab [--async] [--block 20] [--rounds 20] [--sleep-ms 6] [--aa]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_scale.args import add_forward_options, non_negative, positive_int
from bench.gpu_scale.children import free_port_pair
from bench.gpu_scale.engine import Driver, Shape, build_scheduler
from bench.gpu_scale.plugin_report import settled_digest
from bench.gpu_scale.report import summarize
from bench.gpu_scale.step_records import GcClock, Steps
from bench.gpu_scale.workload import Workload

HOOKS = ("add_request", "schedule", "update_from_output", "finish_requests")


class Switch:
    """Turns the plugin on and off under a running scheduler."""

    def __init__(self, sched: Any) -> None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler

        from blockpool_vllm.pool_hooks import WRAPPED

        self.sched = sched
        self.pool = sched.kv_cache_manager.block_pool
        self.passes = sched._mirror.passes
        # (getattr, setattr, delattr: never the objects' __dict__, which CPython
        # would keep their attributes in from then on -- every load of them
        # about twice as slow, in both modes: blockpool_vllm/scheduler.py)
        self.wrapped = {name: getattr(self.pool, name) for name in WRAPPED}
        base = AsyncScheduler if isinstance(sched, AsyncScheduler) else Scheduler
        self.plain = {name: getattr(base, name).__get__(sched) for name in HOOKS}

    def on(self) -> None:
        self.fresh_digest()
        for name, wrapper in self.wrapped.items():
            setattr(self.pool, name, wrapper)
        self.passes.last_flush = time.monotonic()
        self.hooks_on()

    def fresh_digest(self, timeout_s: float = 60.0) -> None:
        """The plugin's digest made the pool's again (O(pool), between two
        blocks, not timed), as a followed engine's is: the steps of an off
        block moved the pool unfollowed, and the rows they left stale were
        found block by block in the on blocks after -- every link a
        difference to read, the reader soon too far behind, a sweep of the
        whole pool through every on block, never finished (the issue's
        configuration, 30 rounds: 0 to 2 digests a run, 4 s read on the
        plugin's thread; a followed engine's plugin ran no sweep in the
        same steps, ``make bench-gpu``).  The sender's batches of the last
        on block are prepared first (its thread adds their blocks)."""
        follower = self.sched._mirror
        deadline = time.monotonic() + timeout_s
        while follower.inflight and time.monotonic() < deadline:
            time.sleep(0.001)
        with follower._digest_lock:
            reader = follower.reader
            reader.clear_pending()
            reader.sweep, reader.sweep_due, reader.verified = None, False, None
            follower.digest.refresh()

    def hooks_on(self) -> None:
        """The scheduler's hooks (its class's methods) only: the pool as it is."""
        for name in HOOKS:
            with contextlib.suppress(AttributeError):
                delattr(self.sched, name)

    def off(self) -> None:
        # the engine never looks idle to the plugin's thread (no flush comes
        # while the hooks are off): else, 50 ms into an off block, it read
        # what the on block left pending, with no plan, while the engine ran
        # -- the on block's work charged to the off block (async, 100 rounds:
        # off's whole step 0.4-0.6 ms longer than on's, its scheduler wall
        # 0.2 ms longer for 0.1 ms less CPU: waiting for the interpreter)
        self.passes.last_flush = math.inf
        for name in self.wrapped:
            with contextlib.suppress(AttributeError):
                delattr(self.pool, name)
        for name, plain in self.plain.items():
            setattr(self.sched, name, plain)


def warmed_up(sched: Any, shape: Shape, args: argparse.Namespace) -> Driver:
    """A driver of ``sched`` (the heap frozen, as vLLM's EngineCore does once
    built) after quick steps until the pool evicts, and ``--warmup-extra``
    more (``shared_options``)."""
    gc.collect()
    gc.freeze()
    workload = Workload(args.seed, max_prompt=8192, min_prompt=1024)
    driver = Driver(sched, workload, shape, shape.max_num_seqs)
    driver.output_cap = 64  # warm-up: quick steps until the pool evicts
    while driver.evictions == 0 and driver.steps_run < args.max_warmup:
        driver.step(0.0, None, None)
    for _ in range(args.warmup_extra):
        driver.step(0.0, None, None)
    driver.output_cap = 0
    return driver


def shared_options(p: argparse.ArgumentParser) -> None:
    """The options of the one-process benches (this one, forked.py)."""
    p.add_argument("--async", dest="async_sched", action="store_true")
    p.add_argument("--num-blocks", type=positive_int, default=524_288)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-warmup", type=int, default=3000)
    p.add_argument("--warmup-extra", type=int, default=300)
    p.add_argument("--json", type=Path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(num_blocks=args.num_blocks, async_sched=args.async_sched)
    port = free_port_pair()
    with tempfile.TemporaryDirectory(prefix="gpu-scale-ab-") as tmp:
        sched = build_scheduler(shape, Path(tmp), plugin=True, endpoint=f"tcp://127.0.0.1:{port}")
        driver = warmed_up(sched, shape, args)
        forward = args.sleep_ms / 1e3
        driver.forward_s_per_token = args.forward_us_per_token / 1e6
        if args.plan_by_shortest:  # (the plan before passes were planned by their tokens)
            sched._mirror.passes.tokens_from = sys.maxsize
        for _ in range(args.settle_steps):  # at the engine's pace, plugin on
            driver.step(forward, None, None)
        switch = Switch(sched)
        steps = {"off": Steps(), "on": Steps()}
        clocks = {"off": GcClock(), "on": GcClock()}
        # each measured step's index in the request stream, per mode (the same
        # seed schedules the same steps in every run: bench/gpu_scale/crossover.py
        # pairs two runs' steps by it)
        index: dict[str, list[int]] = {"off": [], "on": []}
        first = ("on", "off") if args.first == "on" else ("off", "on")
        for r in range(args.rounds):
            for mode in first if r % 2 == 0 else first[::-1]:
                switch.off() if mode == "off" or args.aa else switch.on()
                with clocks[mode] as clock:
                    for _ in range(args.block):
                        index[mode].append(driver.steps_run)
                        driver.step(forward, steps[mode], clock)
        switch.on()  # (a fresh digest) then a block at the engine's pace, plugin on:
        for _ in range(args.block):
            driver.step(forward, None, None)
        digest_check = settled_digest(sched)  # ... is the plugin's digest vLLM's pool's?
        follower = sched._mirror
        doc = {
            "bench": "gpu_scale_ab",
            "scheduler": type(sched).__name__,
            "num_blocks": shape.num_blocks,
            "block": args.block,
            "rounds": args.rounds,
            "sleep_ms": args.sleep_ms,
            "forward_us_per_token": args.forward_us_per_token,
            "plan_by_shortest": args.plan_by_shortest,
            "first": args.first,
            "aa": args.aa,
            "schedule_fingerprint": driver.fingerprint.hexdigest(),
            "tokens_misses": sched._mirror.passes.tokens_misses,
            "digests_taken": sched._mirror.reader.digests_taken,
            "windows_overrun": sched._mirror.reader.windows_overrun,
            "sweeps": sched._mirror.reader.sweeps,
            "digest_check": digest_check,
            "modes": {mode: _summary(steps[mode], clocks[mode]) for mode in steps},
            "per_step": {
                mode: {
                    "index": index[mode],
                    "step_ns": steps[mode].step_ns,
                    "sched_cpu_ns": steps[mode].sched_cpu_ns,
                    "tokens": steps[mode].tokens,
                }
                for mode in steps
            },
            "follower_cost_us_p50_p99_max": follower.cost_quantiles(),
        }
        sched.shutdown()
    off, on = doc["modes"]["off"], doc["modes"]["on"]
    doc["added"] = {
        part: {q: round(on[part][q] - off[part][q], 4) for q in ("p50_ms", "mean_ms")}
        for part in ("sched_cpu", "sched", "step")
    }
    doc["throughput_ratio"] = round(off["step"]["mean_ms"] / on["step"]["mean_ms"], 4)
    return doc


def _summary(st: Steps, clock: GcClock) -> dict[str, Any]:
    return {
        "steps": len(st.step_ns),
        "sched_cpu": summarize(st.sched_cpu_ns),
        "sched": summarize(st.sched_ns),
        "step": summarize(st.step_ns),
        "gc_collections": clock.summary()["collections"],
        "gc_ms": round(sum(clock.summary()["ns"]) / 1e6, 2),
        "tokens_per_step": round(statistics.fmean(st.tokens), 1) if st.tokens else 0.0,
    }


def table(doc: dict[str, Any]) -> str:
    off, on, added = doc["modes"]["off"], doc["modes"]["on"], doc["added"]
    lines = [
        f"{doc['scheduler']}  {doc['num_blocks']:,} blocks  {doc['rounds']} rounds x "
        f"{doc['block']} steps per mode (ABBA)  sleep {doc['sleep_ms']} ms"
        f" + {doc['forward_us_per_token']} us/token"
        + ("  (planned by the shortest pass)" if doc["plan_by_shortest"] else "")
        + ("  A/A: the plugin off in both modes" if doc["aa"] else ""),
        f"{'per step (ms)':<30}{'off':>9}{'on':>9}{'added':>9}",
    ]
    lines.extend(
        f"{label + ' ' + q[:-3]:<30}{off[part][q]:>9.3f}{on[part][q]:>9.3f}{added[part][q]:>+9.3f}"
        for label, part in (
            ("scheduler CPU (engine thread)", "sched_cpu"),
            ("scheduler wall", "sched"),
            ("whole step", "step"),
        )
        for q in ("p50_ms", "mean_ms")
    )
    lines.append(f"{'gc collections / ms (off)':<30}{off['gc_collections']!s:>14} {off['gc_ms']}")
    lines.append(f"{'gc collections / ms (on)':<30}{on['gc_collections']!s:>14} {on['gc_ms']:>6}")
    lines.append(
        f"{'tokens scheduled a step':<30}"
        f"{off['tokens_per_step']:>9.1f}{on['tokens_per_step']:>9.1f}"
        "  (other steps in each mode: bench/gpu_scale/crossover.py runs the same in both)"
    )
    lines.append(f"throughput ratio (mean step off/on): {doc['throughput_ratio']:.3f}x")
    lines.append(f"follower's own cost p50/p99/max us: {doc['follower_cost_us_p50_p99_max']}")
    lines.append(
        f"digests taken {doc['digests_taken']}, readings the engine came back to "
        f"{doc['windows_overrun']}, plans by tokens found too long {doc['tokens_misses']}, "
        f"sweeps {doc['sweeps']}"
    )
    lines.append(f"digest against vLLM's pool after a last on block: {doc['digest_check']}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared_options(p)
    p.add_argument("--block", type=positive_int, default=20, help="steps per mode, each round")
    p.add_argument("--rounds", type=positive_int, default=20)
    p.add_argument("--sleep-ms", type=non_negative, default=6.0)
    add_forward_options(p)
    p.add_argument(
        "--plan-by-shortest",
        action="store_true",
        help="plan every pass by the shortest kept, not by its tokens (to compare)",
    )
    p.add_argument("--settle-steps", type=int, default=400)
    p.add_argument(
        "--first",
        choices=("off", "on"),
        default="off",
        help="the mode of the first block (then ABBA); bench/gpu_scale/crossover.py runs both",
    )
    p.add_argument(
        "--aa",
        action="store_true",
        help="the plugin off in both modes: what the bench tells apart with no difference",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    doc = run(args)
    sys.stdout.write(table(doc) + "\n")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
