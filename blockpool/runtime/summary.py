"""The pool's headline figures, under one set of names.

REST's summary, every stream frame's header and a recorded moment all carry
this dict, so a figure has one name wherever it is read (vLLM's where vLLM
has one: ``num_free_blocks``, the prefix cache's ``queries`` and ``hits`` in
tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blockpool.runtime.runtime import PoolRuntime


def pool_summary(rt: PoolRuntime) -> dict[str, Any]:
    pool = rt.pool
    stats = rt.manager.stats
    return {
        "num_blocks": pool.num_gpu_blocks,
        "blocks": rt.columns.summary(),
        "num_free_blocks": pool.get_num_free_blocks(),
        "usage": float(pool.get_usage()),
        "hash_map_keys": len(pool.cached_block_hash_to_block),
        "running_requests": len(rt.manager.requests),
        "prefix_cache": {
            "requests": stats.requests,
            "queries_tokens": stats.queries,
            "hits_tokens": stats.hits,
            "hit_rate": stats.hit_rate,
        },
    }
