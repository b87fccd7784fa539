"""Run vLLM 0.16.0's own Scheduler, followed by blockpool's plugin (run by the
vLLM 0.16.0 python; tests/vllm016/test_mirror016.py starts it).

``MirrorScheduler`` (blockpool_vllm/scheduler.py) over 0.16's Scheduler with
its real KVCacheManager and BlockPool: requests that share prefixes are added,
scheduled and given one sampled token a step (no model: the scheduler only
needs the token ids), until every one is done.  The plugin publishes on
BLOCKPOOL_MIRROR_ENDPOINT as in an engine.  The script waits for a mirror's
first snapshot request before it starts (so that one is listening), prints
one JSON line with the final operation count and the real pool's digest, and
exits when its stdin closes.

Usage: drive_mirror016.py WORKDIR NUM_BLOCKS NUM_REQUESTS
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from tests.support.tiny_llama import write_tiny_llama

BLOCK = 16


def main() -> int:
    work, num_blocks, num_requests = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    model = write_tiny_llama(work / "tiny", 4096)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["HF_HUB_OFFLINE"] = "1"

    import torch
    import vllm
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from blockpool_vllm.scheduler import MirrorScheduler

    assert vllm.__version__.startswith("0.16."), vllm.__version__
    mc = ModelConfig(model=str(model), skip_tokenizer_init=True, max_model_len=2048, seed=0)
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    sched_cfg = SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=256, max_model_len=2048, is_encoder_decoder=False
    )
    vc = VllmConfig(
        model_config=mc,
        cache_config=cache,
        scheduler_config=sched_cfg,
        device_config=DeviceConfig(device="cpu"),
    )
    vc.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    sched = MirrorScheduler(
        vllm_config=vc,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=BLOCK,
        log_stats=True,
    )
    follower, sender = sched._mirror, sched._mirror_sender
    assert follower is not None and sender is not None
    print(json.dumps({"ready": True}), flush=True)
    while sender.snapshots < 1:  # a mirror is listening (it asked for its first snapshot)
        time.sleep(0.01)

    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK, sha256)
    rng = random.Random(3)
    prefixes = [[rng.randrange(100, 30000) for _ in range(BLOCK * rng.randrange(1, 6))]
                for _ in range(6)]  # fmt: skip
    pending = []
    for i in range(num_requests):
        prompt = rng.choice(prefixes) + [
            rng.randrange(100, 30000) for _ in range(rng.randrange(1, BLOCK * 8))
        ]
        pending.append((f"r{i}", prompt, rng.randrange(1, 40)))
    hits = 0
    while pending or sched.has_requests():
        for _ in range(rng.randrange(0, 3)):
            if pending:
                rid, prompt, out_n = pending.pop(0)
                sched.add_request(
                    Request(
                        rid,
                        prompt,
                        SamplingParams(max_tokens=out_n, ignore_eos=True),
                        None,
                        None,
                        block_hasher=hasher,
                    )
                )
        if not sched.has_requests():
            continue
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = sched.requests[rid]
            done = r.num_computed_tokens + out.num_scheduled_tokens[rid] >= r.num_tokens
            sampled.append([rng.randrange(100, 30000)] if done else [])
        mro = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        time.sleep(0.002)  # the forward pass (the plugin's thread takes its digests then)
        for outs in sched.update_from_output(out, mro).values():
            st = outs.scheduler_stats
            if st is not None and st.prefix_cache_stats is not None:
                hits += st.prefix_cache_stats.hits
        # the scheduler's queues once the step's records are out (batch follower.seq)
        print(json.dumps({"seq": follower.seq, "running": len(sched.running),
                          "waiting": len(sched.waiting)}), flush=True)  # fmt: skip
    batch = follower.flush(force_digest=True)
    assert batch is not None and batch.digest is not None
    print(json.dumps({"ops": follower.op_count, "digest": batch.digest.value, "hits": hits,
                      "stats": follower.stats(), "drops": follower.drops}), flush=True)  # fmt: skip
    sys.stdin.read()  # the mirror may still ask for a snapshot
    sched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
