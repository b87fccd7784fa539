"""get_new_blocks(n) + free_blocks on vLLM 0.16.0's pool and ours, same process.

Reference points (vLLM on this machine class): n=100 about 50 us,
n=10 about 7.6 us.  Run with the vLLM venv ``make bench-vllm`` builds:

    /tmp/vllm016/bin/python bench/micro_vs_vllm.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blockpool as bp

try:
    from vllm.v1.core.block_pool import BlockPool as VllmPool
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector
except ImportError:
    sys.exit("run with the vLLM 0.16.0 venv (vllm016_setup.sh)")


def per_pair_us(pool_cls: type, collector_cls: type, n: int, reps: int) -> float:
    pool = pool_cls(
        num_gpu_blocks=40_000,
        enable_caching=True,
        hash_block_size=16,
        enable_kv_cache_events=True,
        metrics_collector=collector_cls(sample_rate=0.01),
    )
    t = time.perf_counter()
    for _ in range(reps):
        blocks = pool.get_new_blocks(n)
        pool.free_blocks(reversed(blocks))
    return (time.perf_counter() - t) / reps * 1e6


def main() -> None:
    for n, reps in ((10, 20_000), (100, 4_000)):
        runs: dict[str, list[float]] = {"vllm": [], "ours": []}
        for _ in range(3):  # alternate, keep the best of each
            runs["vllm"].append(per_pair_us(VllmPool, VllmCollector, n, reps))
            runs["ours"].append(per_pair_us(bp.BlockPool, bp.KVCacheMetricsCollector, n, reps))
        v, o = min(runs["vllm"]), min(runs["ours"])
        print(
            f"get_new_blocks({n}) + free_blocks: vLLM {v:.1f} us, blockpool {o:.1f} us, "
            f"{v / o:.2f}x"
        )


if __name__ == "__main__":
    main()
