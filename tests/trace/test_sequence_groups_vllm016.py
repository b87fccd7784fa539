"""Sequence mode over KV-cache groups against vLLM 0.16.0's own KVCacheManager.

One subprocess in the 0.16.0 environment (``bench/parity/groups016.py``)
replays a generated trace one request at a time through vLLM's manager with
the same groups -- a sliding window alone, full attention and a window, full
attention and two windows -- at several pool sizes; per request the hit
tokens and the refusals, and the totals with the evictions, must equal ours.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from blockpool import check_invariants, sha256
from blockpool.core.attention import GroupSpec
from blockpool.trace.replay.sequence import SequencePools
from blockpool.trace.replay.sequence_groups import GroupSequenceDriver
from blockpool.trace.workload.reader import Trace
from tests.trace.sched_traces import TOKENS_PER_ID, write_trace
from tests.vllm_envs import run_vllm016_harness

BLOCK_SIZE = 16
LAYOUTS: dict[str, list[tuple[str, int | None]]] = {
    "sliding": [("sliding_window", 200)],
    "full+sliding": [("full_attention", None), ("sliding_window", 128)],
    "full+two windows": [
        ("full_attention", None),
        ("sliding_window", 64),
        ("sliding_window", 300),
    ],
}
BLOCKS = [60, 150, 300, 700]


def ours(trace: Trace, layout: list[tuple[str, int | None]]) -> list[GroupSequenceDriver]:
    specs = [GroupSpec(kind, BLOCK_SIZE, window) for kind, window in layout]  # type: ignore[arg-type]
    pools = SequencePools(trace, BLOCK_SIZE, [b * BLOCK_SIZE for b in BLOCKS], sha256,
                          groups=specs)  # fmt: skip
    drivers = [d for d in pools.drivers if isinstance(d, GroupSequenceDriver)]
    assert len(drivers) == len(BLOCKS)
    for d in drivers:
        d.hits = []
    pools.run()
    for d in drivers:
        check_invariants(d.pool)
    return drivers


@pytest.mark.vllm016
def test_hits_and_refusals_equal_vllm_016s_manager(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl", 11, 150)
    (tmp_path / "layouts.json").write_text(json.dumps(LAYOUTS))
    theirs: dict[str, dict[str, Any]] = run_vllm016_harness(
        "groups016.py",
        [str(tmp_path / "trace.jsonl"), "--tokens-per-id", str(TOKENS_PER_ID),
         "--block-size", str(BLOCK_SIZE), "--layouts", str(tmp_path / "layouts.json"),
         "--blocks", ",".join(map(str, BLOCKS))],
        tmp_path,
    )  # fmt: skip
    assert set(theirs) == set(LAYOUTS)
    refused_somewhere = evicted_somewhere = False
    for name, layout in LAYOUTS.items():
        for blocks, d in zip(BLOCKS, ours(trace, layout), strict=True):
            v = theirs[name][str(blocks)]
            assert d.hits == v["hits"], (name, blocks)
            r = d.result
            assert (r.hit_tokens, r.refused, r.evictions) == (
                v["hit_tokens"], v["refused"], v["evictions"]), (name, blocks)  # fmt: skip
            assert r.admitted + r.refused == len(trace)
            refused_somewhere |= r.refused > 0
            evicted_somewhere |= r.evictions > 0
        # the largest pool hits something: the trace shares prefixes
        assert theirs[name][str(BLOCKS[-1])]["hit_tokens"] > 0
    assert refused_somewhere and evicted_somewhere
