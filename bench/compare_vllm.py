#!/usr/bin/env python3
"""compare_vllm.py -- differential check of blockpool against vLLM 0.16.0.

Runs with the interpreter that has vLLM 0.16.0 installed:

    /tmp/vllm016/bin/python bench/compare_vllm.py [--seeds 6] [--ops 3000]

It drives vLLM's real BlockPool and ours side by side with the same long,
seeded operation sequences -- request admission with prefix lookups and
touches, decode with allocation and caching as blocks fill, frees in several
orders (reversed request tables, forward, shuffled, several tables at once),
duplicates under one key (requests that skip the prefix cache), sliding-window
style null blocks, extra touches of cached hits, evict_blocks (held, free,
null, repeated and out-of-range ids), reset_prefix_cache (refused and
accepted), multi-group get_cached_block, and hash_block_size != block_size
(coarse) caching -- with a KVCacheMetricsCollector on each side (patched clock
and random source, so samples are comparable) and KV events on.

After every operation it asserts: the same block ids returned, the same free
queue order, the same hash map (key -> block ids, and whether an entry is a
single block or a dict), the same ref count and hash on every block, the same
pending events (type and every field), the same usage and free count, the same
metric states and pending samples.  When events are taken, the msgpack wire
bytes of the two batches must be equal too.  Request block hashes (LoRA,
cache salt, multimodal extra keys, prompt embeddings, decode) are compared on every change.

Prints a summary; exits 1 on any divergence.  Not part of the test suite:
CI has no vLLM.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# vLLM's NONE_HASH comes from PYTHONHASHSEED; ours is given the same seed.
os.environ["PYTHONHASHSEED"] = "0"

try:
    from parity.manager016 import MANAGER_CONFIGS, ManagerDriver
    from parity.pool016 import Driver
    from parity.pool016_pair import CONFIGS
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    if (exc.name or "").partition(".")[0] in ("parity", "blockpool"):
        raise  # ours, not vLLM's
    sys.exit(
        f"compare_vllm: vLLM 0.16.0 is not importable ({exc}); run with /tmp/vllm016/bin/python"
    )

from parity.common import Totals, parse_args, quiet_logging, seed_range, since

import blockpool as bp  # the checkout's: parity put it first on sys.path

quiet_logging()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(__doc__, argv, seeds=6, ops=3000)
    totals = Totals()
    totals.play_each(
        Driver, CONFIGS, seed_range(args), args.ops,
        lambda st: (
            f"{st.ops} ops, {st.events} events, {st.samples} metric samples, {st.hits} hit "
            f"blocks, {st.errors_matched} matching errors"
        ),
    )  # fmt: skip
    # the request level's operation counts are not among those listed
    totals.play_each(
        ManagerDriver, MANAGER_CONFIGS, seed_range(args), args.ops,
        lambda st: (
            f"{st.ops} ops, {st.events} events, {st.hits} hit blocks, "
            f"{st.counts.get('admit', 0)} admitted, {st.counts.get('refused', 0)} refused, "
            f"{st.counts.get('preempted', 0)} preempted"
        ),
        counts=False,
    )  # fmt: skip
    bp.set_int_block_hashes(True)
    print()
    print(totals.exercised())
    sums = totals.sums
    print(
        f"{totals.runs - totals.failures}/{totals.runs} runs identical: {sums.ops} ops, "
        f"{sums.events} events, {sums.samples} metric samples, {sums.hits} hit blocks, "
        f"{sums.errors_matched} errors raised alike, in {since(totals.started)}"
    )
    return totals.verdict(
        "blockpool matches vLLM 0.16.0 call for call", diverged="diverged from vLLM 0.16.0"
    )


if __name__ == "__main__":
    sys.exit(main())
