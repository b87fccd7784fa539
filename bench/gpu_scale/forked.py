"""The plugin's own cost on the engine's thread: the same steps, run once per mode.

``bench.gpu_scale.ab`` alternates blocks of *different* steps between the
plugin on and off; what it measures carries those steps' spread (about
+-0.1 ms of a 3.7 ms step, 20 rounds).  This bench takes it away: it warms up
one ``MirrorScheduler`` (or ``MirrorAsyncScheduler``) until the pool evicts,
then, at each of ``--points`` moments, forks the process once per mode and
repeat, and each child runs the *same* ``--steps`` steps from the same state
(the schedule's fingerprint is printed: equal in every mode).  A child has no
plugin thread (a fork keeps only the caller's), no socket is touched, and a
batch flushed is dropped as if sent, so what differs between modes is the
engine thread's own work:

* ``off``: vLLM's methods, the pool unwrapped;
* ``on``: the plugin's hooks -- every pool call recorded, a batch flushed at
  the step's end;
* ``passthrough``: each pool method wrapped by a closure that only calls
  through -- the price of a Python wrapper per call, nothing recorded;
* ``sched``: the scheduler's hooks only (request records, the flush), the
  pool unwrapped.

Per mode: the engine thread's CPU per step (``thread_time`` over the steps),
the least of ``--reps`` children at each point (a child first writes every
writable page once, so the copy-on-write faults a fork leaves are not
counted in its steps).  ``--per-method``: each pool method's time per step
and calls, timed from outside the method in every mode (the same calls: the
difference from ``off`` is the hook's).

    python -m bench.gpu_scale.forked [--async] [--steps 300] [--points 2] [--reps 6]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from bench.gpu_scale.ab import Switch, shared_options, warmed_up
from bench.gpu_scale.args import positive_int
from bench.gpu_scale.children import free_port_pair
from bench.gpu_scale.engine import Driver, Shape, build_scheduler
from bench.gpu_scale.step_records import Steps

MODES = ("off", "on", "passthrough", "sched")
PAGE = 4096


def touch_pages() -> int:
    """Write every page of the process's private writable memory once (each
    byte written as it was): the copy-on-write faults of a fresh fork taken
    now, not in the steps measured.  The number of pages."""
    n = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if parts[1] != "rw-p" or (len(parts) > 5 and parts[5].startswith("[v")):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            for addr in range(lo, hi, PAGE):
                byte = ctypes.c_ubyte.from_address(addr)
                byte.value = byte.value
                n += 1
    return n


def set_mode(mode: str, switch: Switch) -> None:
    """The child's plugin as ``mode`` says (see the module doc)."""
    if mode == "on":
        switch.on()
        return
    switch.off()
    if mode == "sched":
        switch.hooks_on()
    elif mode == "passthrough":
        for name in switch.wrapped:
            setattr(switch.pool, name, _through(getattr(switch.pool, name)))


def _through(call: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        return call(*args, **kw)

    return wrapper


def time_methods(switch: Switch) -> dict[str, list[int]]:
    """Each wrapped pool method (as the mode left it), and the follower's
    flush, timed from outside: name -> [ns, calls]."""
    spent: dict[str, list[int]] = {}
    for name in switch.wrapped:
        spent[name] = acc = [0, 0]
        setattr(switch.pool, name, _timed(getattr(switch.pool, name), acc))
    follower = switch.sched._mirror  # its flush: called by the scheduler's hooks only
    spent["flush"] = acc = [0, 0]
    follower.flush = _timed(follower.flush, acc)
    return spent


def _timed(call: Callable[..., Any], acc: list[int]) -> Callable[..., Any]:
    def timed(*args: Any, **kw: Any) -> Any:
        t = perf_counter_ns()
        try:
            return call(*args, **kw)
        finally:
            acc[0] += perf_counter_ns() - t
            acc[1] += 1

    return timed


def child(
    mode: str, switch: Switch, driver: Driver, steps: int, per_method: bool
) -> dict[str, Any]:
    """In a forked child: ``steps`` steps as ``mode``; what they cost."""
    follower = switch.sched._mirror

    def sent(batch: Any) -> bool:  # dropped as if sent: nobody reads it here
        if follower.inflight and follower.inflight[-1] is batch:
            follower.inflight.pop()
        return True

    follower.offer = sent
    set_mode(mode, switch)
    spent = time_methods(switch) if per_method else {}
    touch_pages()
    ops = follower.op_count
    st = Steps()
    for _ in range(steps):
        driver.step(0.0, st, None)
    return {
        "cpu_us": sum(st.sched_cpu_ns) / steps / 1000,
        "fingerprint": driver.fingerprint.hexdigest()[:12],
        "ops": follower.op_count - ops,
        "methods": {k: [v[0] / steps / 1000, v[1] / steps] for k, v in spent.items()},
    }


def in_child(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn`` run in a forked child; its result, through a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 0
        try:
            os.close(r)
            os.write(w, json.dumps(fn()).encode())
        except BaseException as e:  # said to the parent, whatever it was
            os.write(w, json.dumps({"error": repr(e)}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    os.waitpid(pid, 0)
    doc: dict[str, Any] = json.loads(b"".join(chunks) or b'{"error": "no result"}')
    if "error" in doc:
        raise RuntimeError(f"a child failed: {doc['error']}")
    return doc


def run(args: argparse.Namespace) -> dict[str, Any]:
    shape = Shape(
        num_blocks=args.num_blocks, max_num_seqs=args.max_num_seqs, async_sched=args.async_sched
    )
    modes = args.modes
    port = free_port_pair()
    with tempfile.TemporaryDirectory(prefix="gpu-scale-forked-") as tmp:
        sched = build_scheduler(shape, Path(tmp), plugin=True, endpoint=f"tcp://127.0.0.1:{port}")
        driver = warmed_up(sched, shape, args)
        switch = Switch(sched)
        points: list[dict[str, list[dict[str, Any]]]] = []
        for _ in range(args.points):
            for _ in range(args.between):
                driver.step(0.0, None, None)
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
            for rep in range(args.reps):
                for mode in modes if rep % 2 == 0 else modes[::-1]:
                    runs[mode].append(
                        in_child(
                            lambda m=mode: child(m, switch, driver, args.steps, args.per_method)
                        )
                    )
            points.append(runs)
        switch.on()
        sched.shutdown()
    return summarize(args, modes, points)


def summarize(
    args: argparse.Namespace, modes: list[str], points: list[dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "bench": "gpu_scale_forked",
        "scheduler": "async" if args.async_sched else "sync",
        "num_blocks": args.num_blocks,
        "max_num_seqs": args.max_num_seqs,
        "steps": args.steps,
        "reps": args.reps,
        "points": [],
    }
    for runs in points:
        least = {m: min(r["cpu_us"] for r in runs[m]) for m in modes}
        point: dict[str, Any] = {
            "cpu_us_least": {m: round(v, 1) for m, v in least.items()},
            "cpu_us_median": {
                m: round(statistics.median(r["cpu_us"] for r in runs[m]), 1) for m in modes
            },
            "added_us": {m: round(least[m] - least[modes[0]], 1) for m in modes[1:]},
            "fingerprints": {m: sorted({r["fingerprint"] for r in runs[m]}) for m in modes},
            "ops_recorded": {m: runs[m][0]["ops"] for m in modes},
        }
        if args.per_method:
            point["methods_us_least"] = {
                m: {
                    name: [
                        round(min(r["methods"][name][0] for r in runs[m]), 1),
                        round(runs[m][0]["methods"][name][1], 3),
                    ]
                    for name in runs[m][0]["methods"]
                }
                for m in modes
            }
        doc["points"].append(point)
    return doc


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['scheduler']}  {doc['num_blocks']:,} blocks  {doc['max_num_seqs']} seqs  "
        f"{doc['steps']} steps a child, least of {doc['reps']}"
    ]
    for i, p in enumerate(doc["points"]):
        lines.append(f"point {i}: engine thread CPU us/step (least; median)")
        base = None
        for m, v in p["cpu_us_least"].items():
            added = "" if base is None else f"  {v - base:+.1f}"
            base = v if base is None else base
            lines.append(
                f"  {m:<12}{v:>9.1f}{added:<10}  median {p['cpu_us_median'][m]:.1f}  "
                f"schedules {','.join(p['fingerprints'][m])}  ops {p['ops_recorded'][m]}"
            )
        for m, methods in p.get("methods_us_least", {}).items():
            cells = "  ".join(f"{n} {us:.1f} ({calls:.2f})" for n, (us, calls) in methods.items())
            lines.append(f"  {m:<12}us/step (calls/step): {cells}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared_options(p)
    p.add_argument("--max-num-seqs", type=positive_int, default=256)
    p.add_argument("--steps", type=positive_int, default=300, help="steps a child runs")
    p.add_argument("--points", type=positive_int, default=2, help="moments forked at")
    p.add_argument("--between", type=int, default=150, help="steps before each point")
    p.add_argument("--reps", type=positive_int, default=6, help="children per mode and point")
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    p.add_argument("--per-method", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.modes[0] != "off" or not set(args.modes) <= set(MODES):
        p.error(f"--modes: off first, then any of {', '.join(MODES[1:])}")
    doc = run(args)
    print(table(doc))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
