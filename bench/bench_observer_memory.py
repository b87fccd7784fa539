"""What one held hash costs the observer, and how long the largest batch its
limits let through holds it (docs/sizing.md quotes these).

    python -m bench.bench_observer_memory [--hashes 100000]

Memory: the bytes ``tracemalloc`` sees held by a pool's state after it
applied N stored blocks (64-bit int hashes as vLLM's default sends them,
token ids from a 32,000-word vocabulary), per hash.  Time: decoding and
applying one batch at the default limits (``max_batch_bytes``,
``max_batch_hashes``) -- the longest one message can hold the event loop --
next to a vLLM-sized step (512 blocks), measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc

import msgpack

from app.observer.source import Source
from app.shared.settings import ObserverSettings
from blockpool.kvevents.config import SourceSpec
from blockpool.kvevents.decode import decode_batch
from blockpool.kvevents.state import InstanceState


def stored_batch(
    n: int, block_size: int, per_event: int, rng: random.Random, start: int = 1
) -> bytes:
    events = []
    parent = None
    h = start
    for i in range(0, n, per_event):
        k = min(per_event, n - i)
        hashes = [(x * 0x9E3779B97F4A7C15) & ((1 << 64) - 1) for x in range(h, h + k)]
        h += k
        tokens = [rng.randrange(32_000) for _ in range(k * block_size)]
        events.append(["BlockStored", hashes, parent, tokens, block_size, None, "GPU", None])
        parent = hashes[-1]
    return msgpack.packb([time.time(), events, 0])


def held_per_hash(n: int, block_size: int, per_event: int) -> float:
    payload = stored_batch(n, block_size, per_event, random.Random(0))
    batch = decode_batch(payload, 1 << 31)
    gc.collect()
    tracemalloc.start()
    state = InstanceState()
    state.apply(batch.events, 0, batch.ts)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(state.entries) == n
    return held / n


def hold_ms(payload: bytes, **limits: int) -> float:
    """Milliseconds one message holds a source (best of 3)."""
    best = float("inf")
    for _ in range(3):
        s = Source(SourceSpec("b", "tcp://127.0.0.1:1", None, 0), **limits)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        s.feed_live(0, payload)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hashes", type=int, default=100_000)
    args = ap.parse_args()
    n = args.hashes
    print(f"held per hash ({n:,} stored blocks, int64 hashes, tokens < 32,000):")
    for block_size, per_event in ((16, 32), (16, 1), (32, 32), (0, 512)):
        b = held_per_hash(n, block_size, per_event)
        print(f"  block_size {block_size:>2}, {per_event:>3} blocks per event: {b:,.0f} B")
    cfg = ObserverSettings()
    limits = {
        "max_batch_bytes": cfg.max_batch_bytes,
        "max_batch_hashes": cfg.max_batch_hashes,
        "max_batch_events": cfg.max_batch_events,
        "max_batch_tokens": cfg.max_batch_tokens,
        "max_hashes": cfg.max_hashes,
    }
    rng = random.Random(1)
    step = stored_batch(512, 16, 32, rng)
    base = hold_ms(step, **limits)
    print(f"one vLLM-sized step (512 blocks in 16 events, {len(step):,} B): {base:.1f} ms")
    # the largest batches the limits let through: as many one-block events
    # as allowed (the costliest shape to decode), and as many hashes and
    # tokens as allowed in few events
    per_block = cfg.max_batch_tokens // cfg.max_batch_hashes
    shapes = {
        f"{cfg.max_batch_events:,} one-block events": stored_batch(
            cfg.max_batch_events, 16, 1, rng, start=10_000_000
        ),
        f"{cfg.max_batch_hashes:,} blocks of {per_block} tokens, 64 per event": stored_batch(
            cfg.max_batch_hashes, per_block, 64, rng, start=20_000_000
        ),
    }
    for name, payload in shapes.items():
        assert len(payload) <= cfg.max_batch_bytes, (name, len(payload))
        ms = hold_ms(payload, **limits)
        print(f"  {name} ({len(payload):,} B): {ms:.0f} ms = {ms / base:.0f}x the step")
    refused = b"\x00" * (cfg.max_batch_bytes + 1)
    print(f"a payload over max_batch_bytes, refused unread: {hold_ms(refused, **limits):.2f} ms")


if __name__ == "__main__":
    main()
