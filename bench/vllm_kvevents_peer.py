#!/usr/bin/env python3
"""The vLLM side of check_vllm_kvevents.py (run with vLLM 0.16.0's Python).

It imports only vLLM and its dependencies -- none of blockpool -- so what it
reports is vLLM's own reading.  Talks JSON lines: commands on stdin, results
on stdout.

``publish PUB_PORT REPLAY_PORT STEPS SEED``
    vLLM's real KVCacheManager (one full-attention group) runs seeded
    traffic; each step's ``take_events()`` is published through vLLM's real
    ``ZmqEventPublisher`` (binding tcp://*:PUB_PORT, replay on
    tcp://*:REPLAY_PORT).  Prints ``ready``, waits for ``go``, runs, prints
    the pool's hash map as events show it (``maybe_convert_block_hash``),
    waits for ``quit``.

``subscribe ENDPOINT REPLAY_ENDPOINT``
    decodes everything published at ENDPOINT with vLLM's ``KVEventBatch``
    (checking that vLLM re-encodes each payload to the very same bytes),
    until told ``last SEQ``; then asks the replay endpoint for every batch
    from the first seq seen and decodes those too.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "1"
os.environ["PYTHONHASHSEED"] = "0"

import msgspec
import zmq

try:
    import torch
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing as vllm_hashing
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    sys.exit(f"vllm_kvevents_peer: vLLM 0.16.0 is not importable ({exc})")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def say(obj: Any) -> None:
    print(json.dumps(obj), flush=True)


def wait_for(word: str) -> list[str]:
    for line in sys.stdin:
        parts = line.split()
        if parts and parts[0] == word:
            return parts[1:]
    raise SystemExit(f"stdin closed while waiting for {word!r}")


def publish(pub_port: int, replay_port: int, steps: int, seed: int) -> None:
    rng = random.Random(seed)
    block_size = 4
    kv_cache_utils.init_none_hash(vllm_hashing.sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8,
                             dtype=torch.float16)  # fmt: skip
    config = KVCacheConfig(num_blocks=96, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])  # fmt: skip
    manager = KVCacheManager(config, max_model_len=1 << 14, hash_block_size=block_size,
                             enable_caching=True, enable_kv_cache_events=True)  # fmt: skip
    hasher = kv_cache_utils.get_request_block_hasher(block_size, vllm_hashing.sha256)
    publisher = ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=f"tcp://*:{pub_port}",
        replay_endpoint=f"tcp://*:{replay_port}",
        topic="kv",
    )
    say({"ready": True})
    wait_for("go")
    docs = [[rng.randrange(50) for _ in range(block_size * rng.randint(1, 6))] for _ in range(5)]
    running: dict[str, Any] = {}
    published = 0
    for step in range(steps):
        for _ in range(rng.randint(1, 3)):
            x = rng.random()
            if x < 0.4 or not running:
                tokens = list(rng.choice(docs)) + [
                    rng.randrange(50) for _ in range(rng.randint(0, 9))
                ]
                rid = f"r{step}-{len(running)}-{rng.randrange(1 << 30)}"
                req = Request(rid, tokens, SamplingParams(max_tokens=1 << 20), None, None,
                              block_hasher=hasher)  # fmt: skip
                computed, n = manager.get_computed_blocks(req)
                if manager.allocate_slots(req, req.num_tokens - n, n, computed) is None:
                    continue
                req.num_computed_tokens = req.num_tokens
                running[rid] = req
            elif x < 0.75:
                req = running[rng.choice(list(running))]
                new = [rng.randrange(50) for _ in range(rng.choice([1, 2, 5]))]
                req.append_output_token_ids(new)
                if manager.allocate_slots(req, len(new)) is None:
                    k = len(new)
                    del req._all_token_ids[-k:], req._output_token_ids[-k:]
                    manager.free(running.pop(req.request_id))
                    continue
                req.num_computed_tokens = req.num_tokens
            elif x < 0.98 or step > steps * 3 // 4:  # no reset near the end
                manager.free(running.pop(rng.choice(list(running))))
            else:
                while running:
                    manager.free(running.pop(next(iter(running))))
                manager.reset_prefix_cache()
        events = manager.take_events()
        if events:
            publisher.publish(KVEventBatch(ts=time.time(), events=events))
            published += 1
        if step % 20 == 0:
            time.sleep(0.005)
    held: dict[str, int] = {}
    for key, entry in manager.block_pool.cached_block_hash_to_block._cache.items():
        h = kv_cache_utils.maybe_convert_block_hash(kv_cache_utils.get_block_hash(key))
        n = len(entry) if isinstance(entry, dict) else 1
        held[str(h)] = held.get(str(h), 0) + n
    say({"published": published, "last_seq": published - 1, "held": held})
    wait_for("quit")
    publisher.shutdown()


def subscribe(endpoint: str, replay_endpoint: str) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    time.sleep(0.5)  # let the subscription reach the publisher
    say({"subscribed": True})
    (last,) = (int(x) for x in wait_for("last"))
    seen: list[dict[str, Any]] = []
    identical = 0
    while not seen or seen[-1]["seq"] < last:
        if not sub.poll(10_000):
            say({"error": f"nothing received after seq {seen[-1]['seq'] if seen else None}"})
            return
        topic, seq_bytes, payload = sub.recv_multipart()
        batch = decoder.decode(payload)
        identical += encoder.encode(batch) == payload
        seen.append({"topic": topic.decode(), "seq": int.from_bytes(seq_bytes, "big"),
                     "batch": msgspec.to_builtins(batch)})  # fmt: skip
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", seen[0]["seq"].to_bytes(8, "big")])
    replayed: list[dict[str, Any]] = []
    while True:
        if not dealer.poll(10_000):
            say({"error": "the replay did not end"})
            return
        _, seq_bytes, payload = dealer.recv_multipart()
        if seq_bytes == END_SEQ:
            break
        replayed.append({"seq": int.from_bytes(seq_bytes, "big"),
                         "batch": msgspec.to_builtins(decoder.decode(payload))})  # fmt: skip
    say({"live": seen, "identical_reencodings": identical, "replayed": replayed})
    for s in (sub, dealer):
        s.close(linger=0)
    ctx.term()


def main() -> None:
    cmd, *args = sys.argv[1:]
    if cmd == "publish":
        publish(*(int(a) for a in args))  # type: ignore[call-arg]
    elif cmd == "subscribe":
        subscribe(*args)
    else:
        sys.exit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main()
