"""Sequence mode on vLLM 0.33.0's own BlockPool (free order ``uncached_first``).

    PYTHONPATH=$PWD /tmp/vllm033/bin/python bench/parity/curve033.py TRACE \\
        --tokens-per-id 64 --block-size 16 --blocks 100,200,inf

Requests in file order, one at a time, the whole prompt, as
``blockpool/trace/replay/sequence.py`` replays them, but every step is vLLM's: the
block hashes from vLLM's ``Request`` and request block hasher (sha256), the
longest cached prefix by ``get_cached_block`` up to ``num_tokens - 1``
tokens, ``touch``, ``get_new_blocks``, ``cache_full_blocks`` and
``free_blocks`` in reverse (as vLLM's managers free).  A request needing more
blocks than the pool has free (all of them but the null block) is refused.
Prints one JSON line: per pool size (blocks; ``inf``: a pool that never
evicts), each request's hit tokens (-1: refused), the totals, the evictions
(blocks whose hash ``get_new_blocks`` dropped) and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256 as vsha256
from vllm.v1.core import kv_cache_utils as ku
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from blockpool.trace import read_trace  # the trace reader only: the pool is vLLM's


def requests(token_lists: list[list[int]], block_size: int) -> list[Any]:
    hasher = ku.get_request_block_hasher(block_size, vsha256)
    params = SamplingParams(max_tokens=1)
    return [
        Request(str(i), toks, params, None, block_hasher=hasher)
        for i, toks in enumerate(token_lists)
    ]


def replay(num_blocks: int, reqs: list[Any], block_size: int) -> dict[str, Any]:
    """One pool's sequence replay: hit tokens per request, totals, evictions."""
    pool = BlockPool(num_blocks, True, block_size, False)
    evicted = [0]
    evict = pool._maybe_evict_cached_block

    def counted(block: Any) -> bool:
        gone = bool(evict(block))
        evicted[0] += gone
        return gone

    pool._maybe_evict_cached_block = counted
    hits: list[int] = []
    t0 = time.perf_counter()
    for req in reqs:
        n = req.num_tokens
        need = -(-n // block_size)
        if need > pool.get_num_free_blocks():
            hits.append(-1)
            continue
        hashes = req.block_hashes
        found = []
        for h in hashes[: (n - 1) // block_size]:
            got = pool.get_cached_block(h, [0])
            if got is None:
                break
            found.append(got[0])
        pool.touch(found)
        blocks = found + pool.get_new_blocks(need - len(found))
        pool.cache_full_blocks(req, blocks, len(found), n // block_size, block_size, 0)
        pool.free_blocks(reversed(blocks))
        hits.append(len(found) * block_size)
    return {
        "hits": hits,
        "hit_tokens": sum(h for h in hits if h > 0),
        "refused": hits.count(-1),
        "evictions": evicted[0],
        "free_blocks": pool.get_num_free_blocks(),
        "seconds": time.perf_counter() - t0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--tokens-per-id", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks", required=True, help="comma list of num_gpu_blocks, or inf")
    args = ap.parse_args()
    ku.init_none_hash(vsha256)
    trace = read_trace(args.trace, args.tokens_per_id)
    bs = args.block_size
    reqs = requests([trace.prompt_token_ids(r) for r in trace.requests], bs)
    never = sum(-(-r.num_tokens // bs) for r in reqs) + 1  # every block of every request
    out: dict[str, Any] = {}
    for text in args.blocks.split(","):
        out[text] = replay(never if text == "inf" else int(text), reqs, bs)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
