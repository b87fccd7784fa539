#!/usr/bin/env python3
"""bench_hybrid_vs_vllm.py -- KV-cache groups: our KVCacheCoordinator against
vLLM 0.16.0's KVCacheManager on the same hybrid workload, in one process.

    PYTHONPATH=. /tmp/vllm016/bin/python bench/bench_hybrid_vs_vllm.py [--requests 400]

The workload: requests over a few shared documents (prefix hits), each
admitted whole (hit lookup + allocate_slots), then decoded one token at a time
round-robin with up to 16 running; a refusal frees the oldest.  Each side
hashes its own requests (vLLM's Request and hasher, ours).  Both sides take
the same decisions (their results are identical: bench/compare_vllm_hybrid.py),
so they do the same work; the figure is vLLM's time over ours, best of
``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ["PYTHONHASHSEED"] = "0"

from parity.common import quiet_logging, require_vllm

require_vllm("bench_hybrid_vs_vllm")
from parity.hybrid016 import full, vllm_spec, window  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils import hashing as vllm_hashing  # noqa: E402
from vllm.v1.core import kv_cache_utils as vllm_utils  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request as VRequest  # noqa: E402

import blockpool as bp  # noqa: E402
from blockpool.core.attention import GroupSpec  # noqa: E402
from blockpool.core.coordinator import KVCacheCoordinator  # noqa: E402

quiet_logging()

LAYOUTS: list[tuple[str, tuple[GroupSpec, ...]]] = [
    ("sliding only (window 1024)", (window(1024, 16),)),
    ("full + sliding (window 512)", (full(16), window(512, 16))),
    ("full + 2 windows (128, 1024)", (full(16), window(128, 16), window(1024, 16))),
]
NUM_BLOCKS = 3000
MAX_LEN = 1 << 15


class VllmSide:
    def __init__(self, specs: Sequence[GroupSpec]) -> None:
        vllm_utils.init_none_hash(vllm_hashing.sha256)
        groups = [KVCacheGroupSpec([f"l{i}"], vllm_spec(s)) for i, s in enumerate(specs)]
        cfg = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)
        self.m = KVCacheManager(cfg, max_model_len=MAX_LEN, hash_block_size=16)
        self.hasher = vllm_utils.get_request_block_hasher(16, vllm_hashing.sha256)

    def new(self, rid: str, tokens: list[int]) -> Any:
        return VRequest(rid, tokens, SamplingParams(max_tokens=1 << 20), None, None,
                        block_hasher=self.hasher)  # fmt: skip

    def admit(self, r: Any) -> bool:
        hit, n = self.m.get_computed_blocks(r)
        if self.m.allocate_slots(r, r.num_tokens - n, n, hit) is None:
            return False
        r.num_computed_tokens = r.num_tokens
        return True

    def decode(self, r: Any, token: int) -> bool:
        r.append_output_token_ids(token)
        if self.m.allocate_slots(r, 1) is None:
            return False
        r.num_computed_tokens = r.num_tokens
        return True

    def free(self, r: Any) -> None:
        self.m.free(r)


class OurSide:
    def __init__(self, specs: Sequence[GroupSpec]) -> None:
        bp.init_none_hash(bp.sha256, seed="0")
        pool = bp.BlockPool(NUM_BLOCKS, True, 16)
        self.co = KVCacheCoordinator(pool, specs, MAX_LEN)
        self.hasher = bp.get_request_block_hasher(16, bp.sha256)
        self.computed: dict[str, int] = {}

    def new(self, rid: str, tokens: list[int]) -> Any:
        return bp.Request(rid, tokens, block_hasher=self.hasher)

    def admit(self, r: Any) -> bool:
        hit, n = self.co.find_longest_cache_hit(r.block_hashes, r.num_tokens - 1)
        got = self.co.allocate_slots(
            r, r.num_tokens - n, n, hit, num_computed_tokens=0, num_tokens=r.num_tokens
        )
        if got is None:
            return False
        self.computed[r.request_id] = r.num_tokens
        return True

    def decode(self, r: Any, token: int) -> bool:
        computed = r.num_tokens
        r.append_output_token_ids(token)
        got = self.co.allocate_slots(r, 1, num_computed_tokens=computed, num_tokens=r.num_tokens)
        return got is not None

    def free(self, r: Any) -> None:
        self.co.free(r.request_id)


def workload(side: Any, requests: int, seed: int) -> tuple[int, int]:
    """Run the workload; returns (admitted, refusals) to check both sides did
    the same."""
    rng = random.Random(seed)
    docs = [[rng.randrange(30000) for _ in range(rng.randint(200, 2000))] for _ in range(6)]
    live: list[Any] = []
    admitted = refused = 0
    for i in range(requests):
        doc = rng.choice(docs)
        tokens = doc[: rng.randint(len(doc) // 2, len(doc))]
        tokens += [rng.randrange(30000) for _ in range(rng.randint(1, 200))]
        r = side.new(f"r{i}", tokens)
        while not side.admit(r):
            refused += 1
            if not live:
                break
            side.free(live.pop(0))
        else:
            admitted += 1
            live.append(r)
        for _ in range(rng.randint(20, 80)):  # decode steps, round-robin
            for q in list(live):
                if not side.decode(q, rng.randrange(30000)):
                    refused += 1
                    live.remove(q)
                    side.free(q)
        while len(live) > 16:
            side.free(live.pop(0))
    return admitted, refused


def timed(
    side: Callable[[Sequence[GroupSpec]], Any], specs: Sequence[GroupSpec], n: int
) -> tuple[float, tuple[int, int]]:
    t = time.perf_counter()
    out = workload(side(specs), n, 1)
    return time.perf_counter() - t, out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"{args.requests} requests, {NUM_BLOCKS} blocks of 16, best of {args.repeats}")
    for name, specs in LAYOUTS:
        tv: list[float] = []
        to: list[float] = []
        for _ in range(args.repeats):
            v, vout = timed(VllmSide, specs, args.requests)
            o, oout = timed(OurSide, specs, args.requests)
            if vout != oout:
                print(f"  {name}: the two sides differ: vllm {vout} ours {oout}")
                return 1
            tv.append(v)
            to.append(o)
        print(
            f"  {name:<30} vllm {min(tv):6.2f}s  ours {min(to):6.2f}s  "
            f"ratio {min(tv) / min(to):4.2f}x  ({vout[0]} admitted, {vout[1]} refused)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
