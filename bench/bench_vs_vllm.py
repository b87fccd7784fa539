#!/usr/bin/env python3
"""bench_vs_vllm.py -- blockpool's BlockPool against vLLM 0.16.0's, one seeded
scheduler-like workload, the two alternating in one process.

    make bench-vllm            # builds the vLLM venv once, then runs this
    VENV/bin/python bench/bench_vs_vllm.py [--reps 5] [--requests 1200] [--variant both]

The workload (seeded; 16-token blocks, one KV-cache group, a pool the
workload overflows so that allocation evicts cached blocks):

* requests of 150-1800 prompt tokens; most start with one of 32 shared
  prefixes (Zipf-weighted, 64-1200 tokens) and some repeat an earlier prompt
  whole; each decodes 8-200 tokens;
* a scheduler loop running up to ``--max-running`` requests.  Admission: the
  longest cached prefix (``get_cached_block`` per full block, never the block
  of the last prompt token), a free-count check that counts the hits sitting
  in the free queue, ``touch`` of the hits, ``get_new_blocks`` for the rest,
  ``cache_full_blocks``.  Each decode step, per running request:
  ``get_num_free_blocks`` and ``cache_full_blocks`` (mostly returning at
  once, as vLLM's KV-cache manager calls it), and ``get_new_blocks(1)`` on a
  block boundary -- or, with no block free, the newest request is preempted
  (freed, re-queued first).  Finished requests: ``free_blocks(reversed)``.
  Per step ``get_usage`` and ``take_events``; every 50 steps the collector's
  ``drain_events``.

Block hashes are computed once, outside the timed region, and shared by both
sides; the driver is the same code for both.  Variants: ``on`` (KV events
and a metrics collector at sample rate 0.01) and ``off`` (neither).

Printed per variant: pool calls per second of each side (median of the
repetitions) and the median per-repetition ratio ours / vLLM (> 1: ours is
faster).  Both sides must make the same calls and end in the same state
(free queue order, ref counts, cached hashes), else the run is flagged and
exits 1.  ``--min-ratio R`` also exits 1 when a ratio is below R.  A
benchmark, not a test: keep it out of the test suite.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# BLOCKPOOL_SRC=DIR times another checkout's blockpool (e.g. before a change)
sys.path.insert(0, os.environ.get("BLOCKPOOL_SRC") or str(ROOT))
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

try:
    from vllm.v1.core.block_pool import BlockPool as VBlockPool
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VCollector
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    sys.exit(f"bench_vs_vllm: vLLM 0.16.0 is not importable ({exc}); run `make bench-vllm`")

import blockpool as bp  # noqa: E402

BS = 16
VOCAB = 32_000


class Req:
    """What a pool reads from a request, plus the driver's bookkeeping."""

    __slots__ = (
        "all_token_ids", "block_hashes", "blocks", "cache_salt", "done", "lora_request",
        "mm_features", "n_cached", "n_prompt", "n_tokens", "prompt_embeds", "total",
    )  # fmt: skip

    def __init__(self, tokens: list[int], hashes: list[bytes], n_prompt: int) -> None:
        self.all_token_ids = tokens
        self.block_hashes = hashes
        self.n_prompt = n_prompt
        self.total = len(tokens)
        self.lora_request = None
        self.cache_salt = None
        self.mm_features: list[Any] = []
        self.prompt_embeds = None
        self.blocks: list[Any] = []
        self.n_tokens = 0
        self.n_cached = 0
        self.done = False


def make_workload(seed: int, n: int) -> list[tuple[list[int], list[bytes], int]]:
    """(all tokens, hashes of every full block, prompt length) per request."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(64, 1200))] for _ in range(32)]
    weights = [1.0 / (i + 1) for i in range(len(prefixes))]
    seen: list[list[int]] = []
    hasher = bp.get_request_block_hasher(BS, bp.sha256)
    out = []
    for _ in range(n):
        x = rng.random()
        if seen and x < 0.15:
            prompt = list(rng.choice(seen))
        else:
            total = rng.randint(150, 1800)
            prompt = list(rng.choices(prefixes, weights)[0])[:total] if x < 0.85 else []
            prompt += [rng.randrange(VOCAB) for _ in range(max(1, total - len(prompt)))]
            seen.append(prompt)
        tokens = prompt + [rng.randrange(VOCAB) for _ in range(rng.randint(8, 200))]
        hashes = bp.Request("w", tokens, block_hasher=hasher).block_hashes
        out.append((tokens, list(hashes), len(prompt)))
    return out


def drive(pool: Any, mc: Any, work: Sequence[tuple[list[int], list[bytes], int]],
          max_running: int) -> int:  # fmt: skip
    """The scheduler loop; returns the number of pool calls made."""
    calls = 0
    waiting = deque(Req(t, h, p) for t, h, p in work)
    running: list[Req] = []
    step = 0
    get_cached, touch, new_blocks = pool.get_cached_block, pool.touch, pool.get_new_blocks
    cache, free, num_free = pool.cache_full_blocks, pool.free_blocks, pool.get_num_free_blocks
    gid = [0]
    while waiting or running:
        # admission
        while waiting and len(running) < max_running:
            r = waiting[0]
            hits = []
            for h in r.block_hashes[: (r.n_prompt - 1) // BS]:
                calls += 1
                got = get_cached(h, gid)
                if got is None:
                    break
                hits.append(got[0])
            need = -(-r.n_prompt // BS) - len(hits)
            queued = sum(1 for b in hits if b.ref_cnt == 0)
            calls += 1
            if need + queued > num_free():
                break
            waiting.popleft()
            calls += 2
            touch(hits)
            r.blocks = hits + new_blocks(need)
            r.n_tokens = r.n_prompt
            full = r.n_prompt // BS
            calls += 1
            cache(r, r.blocks, len(hits), full, BS, 0)
            r.n_cached = max(full, len(hits))
            running.append(r)
        # one decode step for every running request
        i = 0
        while i < len(running):
            r = running[i]
            r.n_tokens += 1
            if r.n_tokens > len(r.blocks) * BS:
                calls += 1
                if num_free() == 0:
                    victim = running.pop()  # the newest goes back to the queue's front
                    calls += 1
                    free(reversed(victim.blocks))
                    victim.blocks, victim.n_cached = [], 0
                    waiting.appendleft(victim)
                    if victim is r:
                        continue
                    r.n_tokens -= 1
                    continue
                calls += 1
                r.blocks += new_blocks(1)
            calls += 2
            num_free()
            full = r.n_tokens // BS
            cache(r, r.blocks, r.n_cached, full, BS, 0)
            if full > r.n_cached:
                r.n_cached = full
            if r.n_tokens >= r.total:
                calls += 1
                free(reversed(r.blocks))
                r.blocks = []
                running.pop(i)
                continue
            i += 1
        step += 1
        calls += 2
        pool.get_usage()
        pool.take_events()
        if mc is not None and step % 50 == 0:
            calls += 1
            mc.drain_events()
    return calls


def final_state(pool: Any) -> tuple[Any, ...]:
    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    blocks = [(b.ref_cnt, b.block_hash) for b in pool.blocks[1:]]
    return queue, blocks, len(pool.cached_block_hash_to_block)


def run_side(
    make: Callable[..., Any], collector: Callable[[float], Any], events: bool, blocks: int,
    work: Sequence[tuple[list[int], list[bytes], int]], max_running: int,
) -> tuple[float, int, tuple[Any, ...]]:  # fmt: skip
    mc = collector(0.01) if events else None
    pool = make(blocks, True, BS, events, mc)
    gc.collect()
    gc.disable()
    try:
        t = time.perf_counter()
        calls = drive(pool, mc, work, max_running)
        elapsed = time.perf_counter() - t
    finally:
        gc.enable()
    return elapsed, calls, final_state(pool)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--blocks", type=int, default=6000)
    p.add_argument("--max-running", type=int, default=48)
    p.add_argument("--variant", choices=["both", "on", "off"], default="both")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--min-ratio", type=float, default=None, help="exit 1 below this ratio")
    args = p.parse_args(argv)

    from vllm.utils.hashing import sha256 as vsha256
    from vllm.v1.core import kv_cache_utils as vutils

    vutils.init_none_hash(vsha256)
    bp.init_none_hash(bp.sha256)
    if bp.get_none_hash() != vutils.NONE_HASH:
        sys.exit("bench_vs_vllm: NONE_HASH differs between the two sides")
    t = time.perf_counter()
    work = make_workload(args.seed, args.requests)
    ntok = sum(len(w[0]) for w in work)
    print(f"blockpool from {Path(bp.__file__).parent.parent}")
    print(
        f"workload: {len(work)} requests, {ntok} tokens, pool of {args.blocks} blocks x {BS}, "
        f"up to {args.max_running} running (made in {time.perf_counter() - t:.1f}s)",
        flush=True,
    )
    sides = {
        "vllm": (VBlockPool, VCollector),
        "ours": (bp.BlockPool, bp.KVCacheMetricsCollector),
    }
    variants = ["on", "off"] if args.variant == "both" else [args.variant]
    status = 0
    for variant in variants:
        events = variant == "on"
        rates: dict[str, list[float]] = {"vllm": [], "ours": []}
        ratios: list[float] = []
        for rep in range(args.reps):
            order = ["vllm", "ours"] if rep % 2 == 0 else ["ours", "vllm"]
            got: dict[str, tuple[float, int, tuple[Any, ...]]] = {}
            for name in order:
                make, coll = sides[name]
                got[name] = run_side(make, coll, events, args.blocks, work, args.max_running)
            (tv, cv, sv), (to, co, so) = got["vllm"], got["ours"]
            if cv != co or sv != so:
                print(f"NOT COMPARABLE ({variant}, rep {rep}): calls {cv} vs {co}, "
                      f"final states {'equal' if sv == so else 'differ'}")  # fmt: skip
                return 1
            rates["vllm"].append(cv / tv)
            rates["ours"].append(co / to)
            ratios.append(tv / to)
        ratio = statistics.median(ratios)
        print(
            f"events+metrics {variant:<3}: vLLM 0.16.0 {statistics.median(rates['vllm']):,.0f} "
            f"calls/s, blockpool {statistics.median(rates['ours']):,.0f} calls/s, "
            f"ratio ours/vLLM {ratio:.2f}x (median of {args.reps}; per rep "
            f"{', '.join(f'{r:.2f}' for r in ratios)}); {cv} calls, same final state",
            flush=True,
        )
        if args.min_ratio is not None and ratio < args.min_ratio:
            print(f"BELOW --min-ratio {args.min_ratio}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
