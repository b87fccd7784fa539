#!/usr/bin/env python3
"""compare_vllm_current.py -- our ``free_order="uncached_first"`` against the
current vLLM's BlockPool (0.33.0), which frees that way.

Runs with an interpreter that has vLLM 0.33.0 installed (``pip install
--no-deps vllm==0.33.0`` into its own venv, plus a CPU torch and the support
packages its pool modules import; see docs/vllm-parity.md):

    /tmp/vllm033/bin/python bench/compare_vllm_current.py [--seeds 40] [--ops 400]

Seeded operation sequences drive both pools the way a KV-cache manager does
(prefix lookup and touch of the hits, allocation of the rest, caching of the
full blocks, decode that fills and caches blocks, frees in reverse, forward
and shuffled order, several tables at once, leading null blocks as a sliding
window leaves them, evict_blocks, reset_prefix_cache), with caching on and
off.  Both sides get the same block hashes (ours), so only the pools are
compared.  After every operation: the same block ids returned, the same
free queue order, the same ref counts (the null block's is not kept by
either), the same hash on every block, the same hash map (key -> block ids),
the same free count and usage, and the same events (kind and hashes).

Prints a summary; exits 1 on any divergence.  Not part of the test suite.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

try:
    import importlib.metadata as md

    from parity.pool033 import CONFIGS, Driver
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    if (exc.name or "").partition(".")[0] in ("parity", "blockpool"):
        raise  # ours, not vLLM's
    sys.exit(f"compare_vllm_current: vLLM is not importable ({exc})")

from parity.common import Totals, parse_args, quiet_logging, seed_range, since

import blockpool as bp  # the checkout's: parity put it first on sys.path

quiet_logging()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(__doc__, argv, seeds=40, ops=400)
    bp.init_none_hash(bp.sha256, seed="0")
    version = md.version("vllm")
    totals = Totals()
    for cfg in CONFIGS:
        for seed in seed_range(args):
            totals.play(Driver, cfg, seed, args.ops)
        print(f"  {cfg.name:<24} {args.seeds} seeds done", flush=True)
    print(totals.exercised())
    sums = totals.sums
    print(
        f"{totals.runs - totals.failures}/{totals.runs} runs identical to vLLM {version}'s "
        f"BlockPool: {sums.ops} ops, {sums.events} events, {sums.hits} hit blocks, "
        f"in {since(totals.started)}"
    )
    return totals.verdict(f"free_order='uncached_first' matches vLLM {version} call for call")


if __name__ == "__main__":
    sys.exit(main())
