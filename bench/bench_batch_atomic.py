#!/usr/bin/env python3
"""bench_batch_atomic.py -- what does all-or-nothing cost a batch?

``/api/batch`` applies its operations all or nothing by default
(``on_error: rollback``): a batch with two or more mutating operations is
first tried on a spare runtime (blockpool/runtime/trial.py).  This times,
on a pool that is part full of cached and running requests, the same
two-operation batches (admit a 64-token prompt, finish it) three ways in
the same run:

* ``one by one``  the operations applied with ``PoolRuntime.apply`` (the
                  baseline: what ``on_error: continue`` does);
* ``atomic``      ``trial.apply_all``: the dry run on the spare kept in step
                  by the journal (the spare copied whole once, before timing);
* ``whole copy``  the dry run on a spare copied whole for every batch (what
                  the service did before the journal: O(blocks) a batch).

Reports milliseconds a batch and the ratio to ``one by one``, per pool size.
Not a test.

    python bench/bench_batch_atomic.py [--blocks 4096,65536] [--batches 30]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blockpool.runtime import trial
from blockpool.runtime.config import RuntimeConfig
from blockpool.runtime.ops import AdmitOp, AllocateOp, FinishOp
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import restore, snapshot


def filled(num_blocks: int, seed: int) -> PoolRuntime:
    """A pool with a fortieth as many 20-block prompts: half running, half cached."""
    rt = PoolRuntime(RuntimeConfig(num_blocks=num_blocks))
    rng = random.Random(seed)
    for i in range(num_blocks // 40):
        rt.apply(AdmitOp(request_id=f"r{i}", token_ids=[rng.randrange(30000) for _ in range(320)]))
        if i % 2:
            rt.apply(FinishOp(request_id=f"r{i}"))
    return rt


def batches(n: int, seed: int, tag: str) -> list[list[Any]]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        tokens = [rng.randrange(30000) for _ in range(64)]
        rid = f"{tag}{k}"
        out.append([AdmitOp(request_id=rid, token_ids=tokens), FinishOp(request_id=rid)])
    return out


def whole_copy(rt: PoolRuntime, spare: PoolRuntime, ops: Sequence[Any]) -> None:
    """The dry run as it was: the spare restored from a keyframe each time."""
    restore(spare, snapshot(rt, 0, 0.0), check=False)
    for op in ops:
        spare._execute(op)
    for op in ops:
        rt.apply(op)


def timed(fn: Callable[[Sequence[Any]], Any], work: list[list[Any]]) -> float:
    t0 = time.perf_counter()
    for ops in work:
        fn(ops)
    return (time.perf_counter() - t0) / len(work) * 1000


def measure(num_blocks: int, n: int) -> tuple[float, float, float]:
    """(one by one, atomic, whole copy): milliseconds a batch."""
    rt = filled(num_blocks, 0)
    warm = [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)]
    trial.apply_all(rt, warm, rt.apply)  # the spare's first, whole copy
    base = timed(lambda ops: [rt.apply(op) for op in ops], batches(n, 1, "a"))
    atomic = timed(lambda ops: trial.apply_all(rt, ops, rt.apply), batches(n, 2, "b"))
    rt._journal = None  # (the old way below keeps no journal)
    spare = PoolRuntime(rt.config)
    copy = timed(lambda ops: whole_copy(rt, spare, ops), batches(max(3, n // 5), 3, "c"))
    rt.check()
    return base, atomic, copy


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="4096,65536")
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args(argv)
    print(f"{'blocks':>8} {'one by one':>11} {'atomic':>16} {'whole copy':>18}")
    for nb in (int(x) for x in args.blocks.split(",")):
        base, atomic, copy = measure(nb, args.batches)
        print(
            f"{nb:>8} {base:>8.2f} ms {atomic:>6.2f} ms ({atomic / base:4.1f}x)"
            f" {copy:>8.2f} ms ({copy / base:5.0f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
