#!/usr/bin/env python3
"""compare_vllm_hybrid.py -- our KVCacheCoordinator (KV-cache groups of full
attention and sliding windows) against vLLM 0.16.0's KVCacheManager.

Runs with the interpreter that has vLLM 0.16.0 installed:

    /tmp/vllm016/bin/python bench/compare_vllm_hybrid.py [--seeds 4] [--ops 1500]

Every configuration of parity/hybrid016.py (sliding window only, full +
sliding, several windows alike and unlike, windows under a block and not a
multiple of it, tiny pools, eagle, block sizes a multiple of the hash block
size) for every seed; the operations and what is compared after each are in
that module's docstring.  Prints one line a run and a summary; exits 1 on any
divergence.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

os.environ["PYTHONHASHSEED"] = "0"

from parity.common import (
    RunStats,
    Totals,
    parse_args,
    quiet_logging,
    require_vllm,
    seed_range,
    since,
)

require_vllm("compare_vllm_hybrid")
from parity.hybrid016 import HYBRID_CONFIGS, HybridDriver  # noqa: E402

quiet_logging()


def _line(st: RunStats) -> str:
    c = st.counts
    admitted = c.get("admit", 0) + c.get("admit a first chunk", 0)
    return (
        f"{st.ops} ops, {st.events} events, {st.hits} hit tokens, {admitted} admitted, "
        f"{c.get('refused', 0)} refused, {c.get('preempted', 0)} preempted"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(__doc__, argv, seeds=4, ops=1500)
    totals = Totals()
    totals.play_each(HybridDriver, HYBRID_CONFIGS, seed_range(args), args.ops, _line, width=28)
    print()
    print(totals.exercised())
    sums = totals.sums
    print(
        f"{totals.runs - totals.failures}/{totals.runs} runs identical: {sums.ops} ops, "
        f"{sums.events} events, {sums.hits} hit tokens, in {since(totals.started)}"
    )
    return totals.verdict(
        "KVCacheCoordinator matches vLLM 0.16.0's KVCacheManager",
        diverged="diverged from vLLM 0.16.0",
    )


if __name__ == "__main__":
    sys.exit(main())
