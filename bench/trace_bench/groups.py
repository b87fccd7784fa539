"""``bench_trace.py groups``: see bench/bench_trace.py."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path
from typing import Any

from blockpool import BlockPool, init_none_hash, sha256
from blockpool.core.attention import GroupSpec
from blockpool.core.block_hasher import get_request_block_hasher
from blockpool.trace import read_trace
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.replay.sequence_groups import GroupRequest, GroupSequenceDriver, max_model_len
from blockpool.trace.workload.keys import make_request
from blockpool.trace.workload.reader import Trace
from trace_bench.curve import BLOCK_SIZE

# (kind, window) per group, as vLLM 0.16 groups these models' layers
LAYOUTS: dict[str, list[tuple[str, int | None]]] = {
    "gemma3": [("full_attention", None), ("sliding_window", 1024)],
    "gpt-oss": [("full_attention", None), ("sliding_window", 128)],
    "sliding": [("sliding_window", 4096)],
    "full+two": [("full_attention", None), ("sliding_window", 128), ("sliding_window", 1024)],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace")
    p.add_argument("--layouts", default="gemma3,sliding", help=f"of {', '.join(LAYOUTS)}")
    p.add_argument("--blocks", type=int, default=20000, help="pool size (num_gpu_blocks)")
    p.add_argument("--requests", type=int, default=1000, help="only the first N (0: all)")
    p.add_argument("--tokens-per-id", type=int, default=512)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the figures here")


def _ours(trace: Trace, specs: list[GroupSpec], blocks: int) -> tuple[Any, list[Any]]:
    """A fresh driver and the requests, hashed (outside the timing)."""
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    reqs = []
    for i, req in enumerate(trace.requests):
        r = make_request(trace, req, str(i), hasher)
        reqs.append((req.input_length, GroupRequest(str(i), r.all_token_ids, r.block_hashes, None)))
    pool = BlockPool(blocks, True, BLOCK_SIZE, True)
    d = GroupSequenceDriver(pool, specs, CapacityResult(blocks * BLOCK_SIZE, blocks),
                            max_model_len(trace))  # fmt: skip
    d.hits = []
    return d, reqs


def _run_ours(d: Any, reqs: list[Any]) -> float:
    step = d.step
    gc.collect()
    t0 = time.perf_counter()
    for n, r in reqs:
        step(n, r, r.block_hashes)
    return time.perf_counter() - t0


def _theirs(
    trace: Trace, layout: list[tuple[str, int | None]], blocks: int
) -> tuple[Any, list[Any]]:
    from parity.groups016 import manager
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256 as vsha256
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.request import Request

    ku.init_none_hash(vsha256)
    hasher = ku.get_request_block_hasher(BLOCK_SIZE, vsha256)
    params = SamplingParams(max_tokens=1)
    reqs = [
        Request(str(i), trace.prompt_token_ids(r), params, None, None, block_hasher=hasher)
        for i, r in enumerate(trace.requests)
    ]
    return manager(layout, BLOCK_SIZE, blocks, max_model_len(trace)), reqs


def _run_theirs(m: Any, reqs: list[Any]) -> tuple[float, list[int]]:
    get_computed, allocate, free, take = (
        m.get_computed_blocks, m.allocate_slots, m.free, m.take_events
    )  # fmt: skip
    hits = []
    gc.collect()
    t0 = time.perf_counter()
    for req in reqs:
        computed, n = get_computed(req)
        if allocate(req, req.num_tokens - n, n, computed) is None:
            hits.append(-1)
            continue
        req.num_computed_tokens = req.num_tokens
        free(req)
        take()
        hits.append(n)
    return time.perf_counter() - t0, hits


def bench_groups(args: argparse.Namespace) -> dict[str, Any]:
    init_none_hash(sha256)
    trace = read_trace(args.trace, args.tokens_per_id)
    if args.requests:
        trace = Trace(trace.requests[: args.requests], trace.tokens_per_id)
    out: dict[str, Any] = {"requests": len(trace), "blocks": args.blocks, "layouts": {},
                           "identical": True}  # fmt: skip
    for name in args.layouts.split(","):
        layout = LAYOUTS[name]
        specs = [GroupSpec(k, BLOCK_SIZE, w) for k, w in layout]  # type: ignore[arg-type]
        ours_s, theirs_s = [], []
        for _ in range(args.rounds):
            d, reqs = _ours(trace, specs, args.blocks)
            ours_s.append(_run_ours(d, reqs))
            m, vreqs = _theirs(trace, layout, args.blocks)
            t, hits = _run_theirs(m, vreqs)
            theirs_s.append(t)
            if hits != d.hits:
                out["identical"] = False
            del d, reqs, m, vreqs
        hit_tokens = sum(h for h in hits if h > 0)
        ratio = statistics.median(t / o for t, o in zip(theirs_s, ours_s, strict=True))
        out["layouts"][name] = {
            "groups": layout,
            "ours_s": min(ours_s),
            "vllm_s": min(theirs_s),
            "ratio_median": ratio,
            "hit_tokens": hit_tokens,
            "refused": hits.count(-1),
        }
        print(
            f"{name:10s} {len(trace)} requests at {args.blocks} blocks: ours {min(ours_s):.3f}s, "
            f"vLLM 0.16 KVCacheManager {min(theirs_s):.3f}s, ratio {ratio:.2f}x "
            f"(hit tokens {hit_tokens}, refused {hits.count(-1)}, per request equal: "
            f"{out['identical']})"
        )
    return out
