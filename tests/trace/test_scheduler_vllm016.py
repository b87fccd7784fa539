"""The scheduler model against vLLM 0.16.0's real ``Scheduler``/``AsyncScheduler``.

One subprocess in the 0.16.0 environment (``bench/parity/sched016.py``)
replays a generated trace under several configurations -- vLLM's defaults
(chunked prefill, asynchronous scheduling) at a budget small enough to
chunk, synchronous, priority with a long-prefill threshold, no chunked
prefill, and a ``max_model_len`` that rejects prompts -- and per request the
cached prefix at first schedule, the preemptions and the completion order
must be equal, and so must vLLM's lookup-counted prefix-cache totals.  The
same for KV-cache groups of full attention and sliding windows (a hybrid
``KVCacheConfig``): sliding only, full + sliding, full + two windows, async
and sync, priority, and pools small enough to preempt.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from blockpool import BlockPool, check_invariants, init_none_hash, sha256
from blockpool.trace.replay.results import CapacityResult
from blockpool.trace.sched.group_slots import parse_groups
from blockpool.trace.sched.scheduled import run_scheduled
from blockpool.trace.sched.scheduler import SchedulerConfig
from tests.trace.sched_traces import TOKENS_PER_ID, write_trace
from tests.vllm_envs import REPO, vllm016_python

NUM_BLOCKS = 300
CONFIGS: list[dict[str, Any]] = [
    {"max_num_batched_tokens": 512},
    {"max_num_batched_tokens": 512, "sync": True},
    {"max_num_batched_tokens": 256, "policy": "priority", "long_prefill_token_threshold": 100},
    {"max_num_batched_tokens": 4000, "max_model_len": 4000, "no_chunked_prefill": True,
     "sync": True},
    {"max_num_batched_tokens": 2048, "max_model_len": 1800, "max_num_seqs": 16},
]  # fmt: skip


def _ours(trace: Any, c: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    cfg = SchedulerConfig(
        max_num_batched_tokens=c["max_num_batched_tokens"],
        max_num_seqs=c.get("max_num_seqs", 256),
        enable_chunked_prefill=not c.get("no_chunked_prefill", False),
        long_prefill_token_threshold=c.get("long_prefill_token_threshold", 0),
        max_model_len=c.get("max_model_len", 40960),
        policy=c.get("policy", "fcfs"),
        async_scheduling=not c.get("sync", False),
    )
    init_none_hash(sha256)
    pool = BlockPool(c.get("num_blocks", NUM_BLOCKS), True, 16, False)
    res = CapacityResult(None, pool.num_gpu_blocks)
    groups = parse_groups(c["groups"], 16) if "groups" in c else ()
    run = run_scheduled(trace, pool, 16, sha256, res, cfg, records=True, groups=groups)
    check_invariants(pool)
    return run, res.extra


def _theirs(tmp_path: Path, configs: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """The generated trace and vLLM 0.16.0's runs of it, one per config."""
    python = vllm016_python()
    trace = write_trace(tmp_path / "trace.jsonl", 7, 120)
    (tmp_path / "configs.json").write_text(json.dumps(configs))
    done = subprocess.run(
        [python, str(REPO / "bench/parity/sched016.py"), str(tmp_path / "trace.jsonl"),
         "--tokens-per-id", str(TOKENS_PER_ID), "--num-blocks", str(NUM_BLOCKS),
         "--hf-home", str(tmp_path / "hf"), "--write-hf-cache",
         "--configs", str(tmp_path / "configs.json")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(theirs) == len(configs)
    return trace, theirs


def _assert_same(trace: Any, c: dict[str, Any], v: dict[str, Any]) -> None:
    """Per request the cached prefix at first schedule, the preemptions and
    the completion order, and the lookup-counted totals, as vLLM had them."""
    run, x = _ours(trace, c)
    assert v["unfinished"] == []
    recs = {str(r.index): r for r in run.records}
    got = {k: recs[k].cached_tokens for k in v["cached"]}
    assert got == v["cached"], c
    assert {k: recs[k].preemptions for k in v["preemptions"]} == v["preemptions"], c
    order = sorted((r for r in run.records if r.finish_order >= 0),
                   key=lambda r: r.finish_order)  # fmt: skip
    assert [str(r.index) for r in order] == v["finished"], c
    never = sorted(r.index for r in run.records if r.finish_order < 0)
    assert never == sorted(v["rejected"] + v["refused"]), c
    assert x["rejected_too_long"] == len(v["rejected"]), c
    lk = v["lookups"]
    assert (x["prefix_cache_queries"], x["prefix_cache_hits"], x["prefix_cache_lookups"]) == (
        lk["queries"], lk["hits"], lk["requests"]), c  # fmt: skip


@pytest.mark.vllm016
def test_per_request_equal_to_vllm_016s_scheduler(tmp_path: Path) -> None:
    trace, theirs = _theirs(tmp_path, CONFIGS)
    preempted_somewhere = rejected_somewhere = False
    for c, v in zip(CONFIGS, theirs, strict=True):
        _assert_same(trace, c, v)
        preempted_somewhere |= sum(v["preemptions"].values()) > 0
        rejected_somewhere |= bool(v["rejected"])
    assert preempted_somewhere and rejected_somewhere  # the trace exercises both


# KV-cache groups of full attention and sliding windows (a hybrid KVCacheConfig)
GROUP_CONFIGS: list[dict[str, Any]] = [
    {"max_num_batched_tokens": 512, "groups": "sliding:200"},
    {"max_num_batched_tokens": 512, "groups": "sliding:64", "num_blocks": 40},
    {"max_num_batched_tokens": 512, "groups": "full,sliding:64"},
    {"max_num_batched_tokens": 512, "groups": "full,sliding:64", "sync": True},
    {"max_num_batched_tokens": 256, "groups": "full,sliding:100,sliding:1000"},
    {"max_num_batched_tokens": 256, "policy": "priority", "long_prefill_token_threshold": 100,
     "groups": "full,sliding:128"},
    {"max_num_batched_tokens": 2048, "max_model_len": 1800, "max_num_seqs": 16,
     "groups": "full,sliding:64", "num_blocks": 200},
]  # fmt: skip


@pytest.mark.vllm016
def test_groups_per_request_equal_to_vllm_016s_scheduler(tmp_path: Path) -> None:
    trace, theirs = _theirs(tmp_path, GROUP_CONFIGS)
    preempted = hit = refused = 0
    for c, v in zip(GROUP_CONFIGS, theirs, strict=True):
        _assert_same(trace, c, v)
        preempted += sum(v["preemptions"].values()) > 0
        hit += sum(v["cached"].values()) > 0
        refused += bool(v["refused"])
    # every config hits; most preempt (the sliding-only tiny pool too); one refuses
    assert hit == len(GROUP_CONFIGS) and preempted >= 5 and refused >= 1
