#!/usr/bin/env python3
"""bench_pool.py -- how fast is blockpool's BlockPool on a serving-like workload?

Workload (seeded): requests of 200-2,000 prompt tokens and 16-128 decode
tokens, block size 16, heavy prefix sharing -- 85% start with one of 40 shared
system prompts / documents (Zipf-weighted, 100-1,500 tokens) and 20% of the
rest repeat an earlier prompt exactly.  Pools of 20,000 and 100,000 blocks; the
workload holds more distinct blocks than either, so cached blocks are evicted
when they are reused.

Two phases per pool size and variant (events + metrics collector at
sample_rate 0.01 on, or both off):

* pool calls, driven by a scheduler-like loop (prefix lookup block by block
  until a miss, touch the hits, allocate the rest, cache the full blocks,
  decode with a new block and a cache call at each block boundary, free in
  reverse, take_events each step).  Each call is timed on its own; the
  timer's own cost is measured and subtracted.
* whole requests through RequestManager: admit (hashing included), one
  append of the decode tokens, finish.

Prints a table (best of --reps interleaved runs) and writes JSON (--json, default
bench/results/pool.json).  Not a test: pytest never collects bench/.

    python bench/bench_pool.py [--requests 5000] [--reps 3] [--pools 20000 100000]
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from output import write_json  # noqa: E402

import blockpool as bp  # noqa: E402

BS = 16
VOCAB = 32_000
POOL_OPS = ["get_cached_block", "touch", "get_new_blocks", "cache_full_blocks", "free_blocks"]
POOL_OPS_EXTRA = ["take_events"]
MANAGER_OPS = ["admit", "append_tokens", "finish"]


# ----------------------------------------------------------------- workload


@dataclass
class Req:
    tokens: list[int]  # prompt + decode tokens
    prompt_len: int
    hashes: list[bytes]  # of every full block of ``tokens``


class View:
    """What BlockPool.cache_full_blocks reads from a request."""

    __slots__ = ("all_token_ids", "block_hashes", "lora_request")

    def __init__(self, req: Req) -> None:
        self.all_token_ids = req.tokens
        self.block_hashes = req.hashes
        self.lora_request = None


def make_workload(seed: int, n: int) -> list[Req]:
    rng = random.Random(seed)
    docs = [[rng.randrange(VOCAB) for _ in range(rng.randint(100, 1500))] for _ in range(40)]
    weights = [1.0 / (i + 1) for i in range(len(docs))]
    hasher = bp.get_request_block_hasher(BS, bp.sha256)
    seen: list[list[int]] = []
    out = []
    for _ in range(n):
        if seen and rng.random() < 0.2:
            prompt = rng.choice(seen)
        else:
            total = rng.randint(200, 2000)
            prompt = list(rng.choices(docs, weights)[0])[:total] if rng.random() < 0.85 else []
            prompt += [rng.randrange(VOCAB) for _ in range(total - len(prompt))]
            seen.append(prompt)
        tokens = prompt + [rng.randrange(VOCAB) for _ in range(rng.randint(16, 128))]
        r = bp.Request("w", tokens, block_hasher=hasher)
        out.append(Req(tokens, len(prompt), r.block_hashes))
    return out


# ------------------------------------------------------------------ timing


class Timer:
    """Accumulates per-operation time, calls and blocks."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.blocks: dict[str, int] = {}

    def add(self, op: str, ns: int, blocks: int) -> None:
        self.ns[op] = self.ns.get(op, 0) + ns
        self.calls[op] = self.calls.get(op, 0) + 1
        self.blocks[op] = self.blocks.get(op, 0) + blocks


def timer_overhead_ns() -> float:
    """What an empty timed region reads, on average: subtracted from each call."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(30):
        acc = 0
        for _ in range(2000):
            t0 = clock()
            acc += clock() - t0
        samples.append(acc / 2000)
    return statistics.median(samples)


def make_pool(blocks: int, on: bool) -> bp.BlockPool:
    mc = bp.KVCacheMetricsCollector(0.01, rng=random.Random(7).random) if on else None
    pool = bp.BlockPool(blocks, True, BS, enable_kv_cache_events=on, metrics_collector=mc)
    # As vLLM's engine core does after start-up (freeze_gc_heap): the blocks
    # and the workload go to the permanent generation, so that collections
    # during the run do not walk them.
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return pool


def run_pool_calls(reqs: list[Req], blocks: int, on: bool, max_running: int) -> dict[str, Any]:
    pool = make_pool(blocks, on)
    t = Timer()
    clock = time.perf_counter_ns
    add = t.add
    gid = [0]
    queue = list(range(len(reqs)))[::-1]
    running: list[list[Any]] = []  # [req, view, table, num_tokens, num_cached]
    stats = {"hit_blocks": 0, "evictions": 0, "preempted": 0, "steps": 0}
    while queue or running:
        # admit
        while queue and len(running) < max_running:
            req = reqs[queue[-1]]
            limit = (req.prompt_len - 1) // BS
            hits: list[Any] = []
            for h in req.hashes[:limit]:
                t0 = clock()
                got = pool.get_cached_block(h, gid)  # type: ignore[arg-type]
                add("get_cached_block", clock() - t0, 1)
                if got is None:
                    break
                hits.append(got[0])
            need = -(-req.prompt_len // BS) - len(hits)
            evictable = sum(1 for b in hits if b.ref_cnt == 0)
            if need + evictable > pool.get_num_free_blocks():
                break
            queue.pop()
            t0 = clock()
            pool.touch(hits)
            add("touch", clock() - t0, len(hits))
            t0 = clock()
            new = pool.get_new_blocks(need)
            add("get_new_blocks", clock() - t0, need)
            table = hits + new
            view = View(req)
            full = req.prompt_len // BS
            t0 = clock()
            pool.cache_full_blocks(view, table, len(hits), full, BS, 0)
            add("cache_full_blocks", clock() - t0, full - len(hits))
            stats["hit_blocks"] += len(hits)
            running.append([req, view, table, req.prompt_len, max(full, len(hits))])
        # one decode step for every running request
        stats["steps"] += 1
        still = []
        for entry in running:
            req, view, table, ntok, cached = entry
            ntok += 1
            if ntok > len(table) * BS:
                if pool.get_num_free_blocks() == 0:
                    pool.free_blocks(reversed(table))  # preempt (not timed)
                    stats["preempted"] += 1
                    continue
                t0 = clock()
                table += pool.get_new_blocks(1)
                add("get_new_blocks", clock() - t0, 1)
            full = ntok // BS
            if full > cached:
                t0 = clock()
                pool.cache_full_blocks(view, table, cached, full, BS, 0)
                add("cache_full_blocks", clock() - t0, full - cached)
                cached = full
            if ntok >= len(req.tokens):
                t0 = clock()
                pool.free_blocks(reversed(table))
                add("free_blocks", clock() - t0, len(table))
                continue
            entry[3], entry[4] = ntok, cached
            still.append(entry)
        running = still
        t0 = clock()
        events = pool.take_events()
        add("take_events", clock() - t0, 0)
        stats["evictions"] += sum(1 for e in events if isinstance(e, bp.BlockRemoved))
        if on and stats["steps"] % 50 == 0:
            pool.metrics_collector.drain_events()  # type: ignore[union-attr]
    bp.check_invariants(pool)
    return {"timer": t, "stats": stats}


def run_manager(reqs: list[Req], blocks: int, on: bool, max_running: int) -> dict[str, Any]:
    pool = make_pool(blocks, on)
    mgr = bp.RequestManager(pool)
    t = Timer()
    clock = time.perf_counter_ns
    live: list[str] = []
    refused = 0
    for i, req in enumerate(reqs):
        rid = f"r{i}"
        while True:
            try:
                t0 = clock()
                adm = mgr.admit(rid, req.tokens[: req.prompt_len])
                t.add("admit", clock() - t0, len(adm.block_ids[0]))
                break
            except bp.NotEnoughBlocksError:
                refused += 1
                t0 = clock()
                mgr.finish(live.pop(0))
                t.add("finish", clock() - t0, 0)
        t0 = clock()
        added = mgr.append_tokens(rid, req.tokens[req.prompt_len :])
        t.add("append_tokens", clock() - t0, len(added[0]))
        live.append(rid)
        if len(live) > max_running:
            t0 = clock()
            mgr.finish(live.pop(0))
            t.add("finish", clock() - t0, 0)
        pool.take_events()
    while live:
        t0 = clock()
        mgr.finish(live.pop(0))
        t.add("finish", clock() - t0, 0)
    bp.check_invariants(pool)
    stats = {
        "refused": refused,
        "hit_rate": round(mgr.stats.hit_rate, 4),
        "query_tokens": mgr.stats.queries,
    }
    return {"timer": t, "stats": stats}


# ------------------------------------------------------------------- report


def summarise(
    timers: list[Timer], ops: list[str], overhead: float
) -> list[dict[str, float | int | str]]:
    rows: list[dict[str, float | int | str]] = []
    for op in ops:
        per_rep = []
        for tm in timers:
            calls = tm.calls.get(op, 0)
            if calls:
                per_rep.append(max(tm.ns[op] - overhead * calls, 0.0) / calls)
        if not per_rep:
            continue
        ns_call = min(per_rep)
        calls = timers[0].calls[op]
        blocks = timers[0].blocks[op]
        rows.append(
            {
                "op": op,
                "calls": calls,
                "blocks_per_call": round(blocks / calls, 2),
                "us_per_call": round(ns_call / 1000, 3),
                "ops_per_s": round(1e9 / ns_call) if ns_call else 0,
                "us_per_block": round(ns_call * calls / blocks / 1000, 4) if blocks else None,  # type: ignore[dict-item]
            }
        )
    return rows


def fmt_table(title: str, rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'operation':<20}{'calls':>10}{'blocks/call':>13}{'µs/call':>11}"
        f"{'calls/s':>13}{'µs/block':>11}"
    )
    lines = [title, head, "-" * len(head)]
    for r in rows:
        per_block = "" if r["us_per_block"] is None else f"{r['us_per_block']:.3f}"
        lines.append(
            f"{r['op']:<20}{r['calls']:>10,}{r['blocks_per_call']:>13.1f}"
            f"{r['us_per_call']:>11.3f}{r['ops_per_s']:>13,}{per_block:>11}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--pools", type=int, nargs="+", default=[20_000, 100_000])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-running", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "pool.json")
    args = p.parse_args(argv)

    bp.init_none_hash(bp.sha256, seed="0")
    t_start = time.perf_counter()
    reqs = make_workload(args.seed, args.requests)
    prompt_tokens = sum(r.prompt_len for r in reqs)
    distinct = len({h for r in reqs for h in r.hashes})
    print(
        f"workload: {len(reqs)} requests, {prompt_tokens:,} prompt tokens, "
        f"{sum(len(r.tokens) for r in reqs):,} tokens in all, {distinct:,} distinct full "
        f"blocks (block size {BS}), made in {time.perf_counter() - t_start:.1f}s"
    )
    overhead = timer_overhead_ns()
    print(f"timer overhead: {overhead:.0f} ns per timed call (subtracted)")
    variants = [(blocks, on) for blocks in args.pools for on in (True, False)]
    pool_runs: dict[tuple[int, bool], list[dict[str, Any]]] = {v: [] for v in variants}
    mgr_runs: dict[tuple[int, bool], list[dict[str, Any]]] = {v: [] for v in variants}
    # Repetitions interleave the variants, so that a noisy spell on a shared
    # machine hits all of them alike.
    for rep in range(args.reps):
        for blocks, on in variants:
            pool_runs[blocks, on].append(run_pool_calls(reqs, blocks, on, args.max_running))
            mgr_runs[blocks, on].append(run_manager(reqs, blocks, on, args.max_running))
        print(
            f"  rep {rep + 1}/{args.reps} done ({time.perf_counter() - t_start:.0f}s)", flush=True
        )
    results: list[dict[str, Any]] = []
    for blocks, on in variants:
        variant = "events+metrics(0.01)" if on else "events/metrics off"
        pr, mr = pool_runs[blocks, on], mgr_runs[blocks, on]
        pool_rows = summarise([r["timer"] for r in pr], POOL_OPS + POOL_OPS_EXTRA, overhead)
        mgr_rows = summarise([r["timer"] for r in mr], MANAGER_OPS, overhead)
        st, mst = pr[0]["stats"], mr[0]["stats"]
        print()
        print(
            fmt_table(
                f"== pool of {blocks:,} blocks, {variant}: pool calls "
                f"({st['hit_blocks']:,} hit blocks, {st['evictions']:,} evictions seen"
                f"{'' if on else ' (events off)'}, {st['preempted']} preempted)",
                pool_rows,
            )
        )
        print(
            fmt_table(
                f"-- whole requests via RequestManager (admit hashes the prompt; "
                f"hit rate {mst['hit_rate']:.1%}, {mst['refused']} refused)",
                mgr_rows,
            )
        )
        results.append(
            {
                "pool_blocks": blocks,
                "variant": variant,
                "events": on,
                "metrics_sample_rate": 0.01 if on else None,
                "pool_calls": pool_rows,
                "pool_stats": st,
                "manager": mgr_rows,
                "manager_stats": mst,
            }
        )
    elapsed = time.perf_counter() - t_start
    doc = {
        "benchmark": "blockpool.BlockPool",
        "block_size": BS,
        "requests": len(reqs),
        "prompt_tokens": prompt_tokens,
        "distinct_full_blocks": distinct,
        "reps": args.reps,
        "statistic": "best over reps of the mean time per call, timer overhead subtracted",
        "timer_overhead_ns": round(overhead, 1),
        "gc": "collected and frozen after each pool is built, as vLLM's engine core does",
        "seed": args.seed,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "elapsed_s": round(elapsed, 1),
        "results": results,
    }
    print()
    write_json(args.json, doc, f" ({elapsed:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
