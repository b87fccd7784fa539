"""A trace through vLLM 0.16.0's real ``Scheduler`` (or ``AsyncScheduler``).

Run with the 0.16.0 venv; prints one JSON document: per request its cached
prefix at first schedule (``num_cached_tokens``), preemptions and place in
the completion order, plus the lookup-counted prefix-cache totals and the
wall time of the loop.  The engine loop mirrors ``EngineCore.step``
(synchronous) and ``step_with_batch_queue`` with a queue of two
(asynchronous), on simulated time, with a fake model runner that samples the
trace's output tokens (``ignore_eos``); arrivals, rejections and refusals as
``blockpool.trace.sched.scheduled`` has them, so both sides see the same input.

    VENV016/bin/python bench/parity/sched016.py TRACE --num-blocks 400 \\
        --hf-home DIR [--max-num-batched-tokens 2048 --sync ...]

``--groups full,sliding:64``: the KV-cache groups (a hybrid
``KVCacheConfig`` of full-attention and sliding-window specs; default one
full-attention group), refusals then by ``group_slots.peak_blocks`` as
timed mode has them.

``--hf-home``: an offline Hugging Face cache holding ``Qwen/Qwen3-0.6B``'s
``config.json`` (docs/vllm-parity.md says how; ``--write-hf-cache`` writes
one there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

MODEL = "Qwen/Qwen3-0.6B"
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def write_hf_cache(home: Path, repo: str = MODEL, config: dict[str, Any] = QWEN3_06B) -> None:
    """An offline hub cache with Qwen3-0.6B's config.json (or ``repo``'s ``config``)."""
    rev = "0" * 40
    base = home / "hub" / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    (snap / "config.json").write_text(json.dumps(config))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--tokens-per-id", type=int, default=512)
    p.add_argument("--requests", type=int, default=0, help="first N requests only (0: all)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, required=True, help="num_gpu_blocks (null included)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--no-chunked-prefill", action="store_true")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=40960)
    p.add_argument("--policy", choices=("fcfs", "priority"), default="fcfs")
    p.add_argument("--sync", action="store_true", help="synchronous scheduling")
    p.add_argument("--speed", type=float, default=1.0)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--per-prefill-token-ms", type=float, default=0.0)
    p.add_argument("--per-decode-seq-ms", type=float, default=0.0)
    p.add_argument("--groups", default="", help="KV-cache groups: full,sliding:TOKENS,...")
    p.add_argument("--hf-home", required=True)
    p.add_argument("--write-hf-cache", action="store_true")
    p.add_argument("--repeat", type=int, default=1, help="time the loop this many times")
    p.add_argument(
        "--configs",
        help="a JSON list of objects overriding these options (their dest names), "
        "one run each; prints a JSON list",
    )
    return p.parse_args(argv)


def setup_offline(home: str) -> None:
    os.environ["HF_HOME"] = home
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import vllm.platforms as plat

    plat.builtin_platform_plugins["cpu"] = lambda: "vllm.platforms.cpu.CpuPlatform"  # type: ignore[index]


def make_scheduler(args: argparse.Namespace) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=MODEL, max_model_len=args.max_model_len, skip_tokenizer_init=True)
    sched = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        enable_chunked_prefill=not args.no_chunked_prefill,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        policy=args.policy,
        async_scheduling=not args.sync,
        is_encoder_decoder=False,
    )
    cache = CacheConfig(block_size=args.block_size, enable_prefix_caching=True)
    vcfg = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
    vcfg.cache_config.num_gpu_blocks = args.num_blocks
    shape = {"num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
    groups = []
    for i, g in enumerate(group_specs(args)):
        w = g.sliding_window
        spec: Any = (
            FullAttentionSpec(block_size=g.block_size, **shape)
            if w is None
            else SlidingWindowSpec(block_size=g.block_size, sliding_window=w, **shape)
        )
        groups.append(KVCacheGroupSpec([f"layer{i}"], spec))
    kv = KVCacheConfig(num_blocks=args.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cls = Scheduler if args.sync else AsyncScheduler
    return cls(
        vllm_config=vcfg,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vcfg),
        block_size=args.block_size,
        log_stats=True,
    )


def group_specs(args: argparse.Namespace) -> list[Any]:
    """The ``--groups`` as blockpool's GroupSpecs (one full-attention group by default)."""
    from blockpool.core.attention import GroupSpec
    from blockpool.trace.sched.group_slots import parse_groups

    return parse_groups(args.groups, args.block_size) if args.groups else [GroupSpec()]


def run(args: argparse.Namespace, trace: Any) -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256 as vsha256
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    ku.init_none_hash(vsha256)
    hasher = ku.get_request_block_hasher(args.block_size, vsha256)
    from blockpool.trace.sched.group_slots import needs_groups, peak_blocks

    sched = make_scheduler(args)
    specs = group_specs(args)
    grouped = needs_groups(specs)
    threshold = args.long_prefill_token_threshold
    max_chunk = min(args.max_num_batched_tokens, threshold or args.max_num_batched_tokens)
    bs, mml, usable = args.block_size, args.max_model_len, args.num_blocks - 1
    reqs = trace.requests
    outputs: dict[str, list[int]] = {}
    arrival: dict[str, float] = {}
    made: dict[str, Any] = {}
    in_flight: deque[tuple[Any, list[str], float]] = deque()
    finished: list[str] = []
    rejected: list[int] = []
    refused: list[int] = []
    lookups = {"queries": 0, "hits": 0, "requests": 0}
    base, per_p, per_d = args.step_ms, args.per_prefill_token_ms, args.per_decode_seq_ms

    def step_ms(out: Any) -> float:
        p = d = 0
        for rid, n in out.num_scheduled_tokens.items():
            r = sched.requests[rid]
            if r.num_computed_tokens - n >= r.num_prompt_tokens:
                d += 1
            else:
                p += n
        return base + per_p * p + per_d * d

    def schedule(now: float) -> tuple[Any, list[str], float]:  # noqa: ARG001 the scheduler callback's signature
        out = sched.schedule()
        sampling = [
            rid for rid in out.num_scheduled_tokens if not sched.requests[rid].is_prefill_chunk
        ]
        return out, sampling, step_ms(out)

    def update(item: tuple[Any, list[str], float]) -> None:
        out, sampling, _ = item
        ids = list(out.num_scheduled_tokens)
        toks: list[list[int]] = []
        for rid in ids:
            r = sched.requests.get(rid)
            if rid in sampling and r is not None:
                toks.append([outputs[rid][min(r.num_output_tokens, len(outputs[rid]) - 1)]])
            else:
                toks.append([])
        mro = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=toks
        )
        eco = sched.update_from_output(out, mro)
        for outs in eco.values():
            stats = outs.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                pc = stats.prefix_cache_stats
                lookups["queries"] += pc.queries
                lookups["hits"] += pc.hits
                lookups["requests"] += pc.requests
            finished.extend(o.request_id for o in outs.outputs if o.finish_reason is not None)

    i, clock, total = 0, 0.0, len(reqs)
    t0 = time.perf_counter()
    c0 = time.process_time()
    while i < total or sched.has_requests() or in_flight:
        if not sched.has_requests() and not in_flight:
            clock = max(clock, reqs[i].timestamp_ms / args.speed)
        while i < total and reqs[i].timestamp_ms / args.speed <= clock:
            tr = reqs[i]
            i += 1
            if tr.input_length >= mml:
                rejected.append(tr.index)
                continue
            out_n = max(tr.output_length, 1)
            if tr.input_length + out_n > mml:
                out_n = mml - tr.input_length
            longest = tr.input_length + out_n - 1
            need = peak_blocks(specs, longest, max_chunk) if grouped else -(-longest // bs)
            if need > usable:
                refused.append(tr.index)
                continue
            rid = str(tr.index)
            outputs[rid] = trace.output_token_ids(tr) if tr.output_length else [0]
            arrival[rid] = tr.timestamp_ms / args.speed
            made[rid] = Request(
                rid,
                trace.prompt_token_ids(tr),
                SamplingParams(max_tokens=max(tr.output_length, 1), ignore_eos=True),
                None,
                None,
                arrival_time=tr.timestamp_ms / args.speed,
                priority=tr.priority,
                block_hasher=hasher,
            )
            sched.add_request(made[rid])
        dt = 0.0
        if args.sync:
            if sched.has_requests():
                item = schedule(clock)
                dt = item[2]
                update(item)
        elif sched.has_requests():
            item = schedule(clock)
            dt = item[2]
            in_flight.appendleft(item)
            if not (item[0].num_scheduled_tokens and len(in_flight) < 2):
                update(in_flight.pop())
        elif in_flight:
            update(in_flight.pop())
        clock += dt
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "cached": {rid: r.num_cached_tokens for rid, r in made.items()},
        "preemptions": {rid: r.num_preemptions for rid, r in made.items()},
        "finished": finished,
        "rejected": rejected,
        "refused": refused,
        "lookups": lookups,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "unfinished": sorted(sched.requests),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    home = Path(args.hf_home)
    if args.write_hf_cache:
        write_hf_cache(home)
    setup_offline(str(home))
    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from blockpool.trace import read_trace
    from blockpool.trace.workload.reader import Trace

    trace = read_trace(args.trace, args.tokens_per_id)
    if args.requests:
        trace = Trace(trace.requests[: args.requests], trace.tokens_per_id)
    variants = json.loads(Path(args.configs).read_text()) if args.configs else [{}]
    docs = []
    for over in variants:
        a = argparse.Namespace(**{**vars(args), **over})
        doc: dict[str, Any] = {}
        times = []
        for _ in range(a.repeat):
            doc = run(a, trace)
            times.append(doc["seconds"])
        doc["seconds_all"] = times
        docs.append(doc)
    print(json.dumps(docs if args.configs else docs[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
