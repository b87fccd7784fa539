"""Sequence mode over KV-cache groups through vLLM 0.16.0's own KVCacheManager.

    PYTHONPATH=$PWD /tmp/vllm016/bin/python bench/parity/groups016.py TRACE \\
        --tokens-per-id 64 --block-size 16 --layouts LAYOUTS.json --blocks 100,200

``LAYOUTS.json``: ``{"name": [["full_attention", null], ["sliding_window", 128]], ...}``.
Requests in file order, one at a time, the whole prompt, as
``blockpool/trace/replay/sequence_groups.py`` replays them: ``get_computed_blocks``,
``allocate_slots`` for the rest (``None``: refused), ``free``.  Prints one
JSON line: per layout and pool size (blocks), each request's hit tokens (-1:
refused), the totals, the evictions (``BlockRemoved`` events) and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256 as vsha256
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blockpool.trace import read_trace
from blockpool.trace.workload.reader import Trace

Layout = list[tuple[str, int | None]]


def vllm_groups(layout: Layout, block_size: int) -> list[Any]:
    out = []
    for i, (kind, window) in enumerate(layout):
        common = {"block_size": block_size, "num_kv_heads": 1, "head_size": 8,
                  "dtype": torch.float16}  # fmt: skip
        if kind == "full_attention":
            spec: Any = FullAttentionSpec(**common)
        else:
            spec = SlidingWindowSpec(**common, sliding_window=window)
        out.append(KVCacheGroupSpec([f"layer{i}"], spec))
    return out


def manager(layout: Layout, block_size: int, num_blocks: int, model_len: int) -> Any:
    config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=vllm_groups(layout, block_size)
    )
    return KVCacheManager(
        config,
        max_model_len=model_len,
        hash_block_size=block_size,
        enable_caching=True,
        enable_kv_cache_events=True,
    )


def prompts(trace: Trace) -> list[list[int]]:
    return [trace.prompt_token_ids(r) for r in trace.requests]


def replay(m: Any, tokens: list[list[int]], block_size: int) -> dict[str, Any]:
    """One pool's sequence replay: hits per request, totals, evictions."""
    hasher = ku.get_request_block_hasher(block_size, vsha256)
    params = SamplingParams(max_tokens=1)
    hits: list[int] = []
    evictions = 0
    get_computed, allocate, free, take = (
        m.get_computed_blocks, m.allocate_slots, m.free, m.take_events
    )  # fmt: skip
    t0 = time.perf_counter()
    for i, toks in enumerate(tokens):
        req = Request(str(i), toks, params, None, None, block_hasher=hasher)
        computed, n = get_computed(req)
        if allocate(req, len(toks) - n, n, computed) is None:
            hits.append(-1)
            continue
        req.num_computed_tokens = len(toks)
        free(req)
        for ev in take():
            if type(ev).__name__ == "BlockRemoved":
                evictions += len(ev.block_hashes)
        hits.append(n)
    seconds = time.perf_counter() - t0
    return {
        "hits": hits,
        "hit_tokens": sum(h for h in hits if h > 0),
        "refused": hits.count(-1),
        "evictions": evictions,
        "seconds": seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--tokens-per-id", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layouts", type=Path, required=True)
    ap.add_argument("--blocks", required=True, help="comma list of pool sizes (num_gpu_blocks)")
    args = ap.parse_args()
    ku.init_none_hash(vsha256)
    trace = read_trace(args.trace, args.tokens_per_id)
    tokens = prompts(trace)
    model_len = max((len(t) for t in tokens), default=1)
    layouts = json.loads(args.layouts.read_text())
    out: dict[str, dict[str, Any]] = {}
    for name, layout in layouts.items():
        out[name] = {}
        for b in (int(x) for x in args.blocks.split(",")):
            m = manager([tuple(g) for g in layout], args.block_size, b, model_len)
            out[name][str(b)] = replay(m, tokens, args.block_size)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
