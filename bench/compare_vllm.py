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

import argparse
import logging
import os
import random
import sys
import time
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# vLLM's NONE_HASH comes from PYTHONHASHSEED; ours is given the same seed.
os.environ["PYTHONHASHSEED"] = "0"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

try:
    import msgspec
    import torch
    import vllm.envs as vllm_envs
    import vllm.v1.core.kv_cache_metrics as vllm_metrics_mod
    from vllm.distributed.kv_events import KVEventBatch as VKVEventBatch
    from vllm.lora.request import LoRARequest as VLoRARequest
    from vllm.multimodal.inputs import MultiModalFeatureSpec as VMMFeature
    from vllm.multimodal.inputs import PlaceholderRange as VPlaceholder
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing as vllm_hashing
    from vllm.v1.core import kv_cache_utils as vllm_utils
    from vllm.v1.core.block_pool import BlockPool as VBlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VKVCacheManager
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VCollector
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request as VRequest
except ImportError as exc:  # pragma: no cover - needs the vLLM venv
    sys.exit(
        f"compare_vllm: vLLM 0.16.0 is not importable ({exc}); run with /tmp/vllm016/bin/python"
    )

import blockpool as bp  # noqa: E402

logging.getLogger("vllm").setLevel(logging.ERROR)
logging.getLogger("blockpool").setLevel(logging.ERROR)

VOCAB = 1000


class Divergence(AssertionError):
    pass


# ---------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    name: str
    num_blocks: int
    hash_block_size: int
    groups: tuple[tuple[int, int], ...]  # (group id, block size)
    sample_rate: float = 1.0
    hash_name: str = "sha256"
    int_hashes: bool = True

    @property
    def uniform(self) -> bool:
        return len({bs for _, bs in self.groups}) == 1


CONFIGS = [
    Config("one group", 96, 4, ((0, 4),)),
    Config("two groups", 160, 4, ((0, 4), (1, 4)), sample_rate=0.3),
    Config("coarse x2", 80, 2, ((0, 4),), hash_name="sha256_cbor"),
    Config("mixed x1/x3, raw hashes", 200, 2, ((0, 2), (3, 6)), int_hashes=False),
    Config("big pool", 600, 16, ((0, 16),)),
]


# ----------------------------------------------------------------- sides


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


@dataclass
class Side:
    """One implementation: its pool, collector and request factory."""

    name: str
    pool: Any
    mc: Any
    make_request: Callable[..., Any]


def make_sides(cfg: Config, seed: int, clock: Clock) -> tuple[Side, Side]:
    vllm_fn = getattr(vllm_hashing, cfg.hash_name)
    our_fn = bp.get_hash_fn_by_name(cfg.hash_name)
    vllm_utils.init_none_hash(vllm_fn)
    bp.init_none_hash(our_fn, seed="0")
    if bp.get_none_hash() != vllm_utils.NONE_HASH:
        raise Divergence("NONE_HASH differs")
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "1" if cfg.int_hashes else "0"
    if cfg.int_hashes != vllm_envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
        raise RuntimeError("could not set VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES")
    bp.set_int_block_hashes(cfg.int_hashes)

    # vLLM's collector reads time.monotonic_ns() and random.random() from
    # its module globals: point them at the shared clock and a seeded stream.
    vllm_metrics_mod.time = types.SimpleNamespace(monotonic_ns=clock)  # type: ignore[assignment]
    vllm_metrics_mod.random = types.SimpleNamespace(random=random.Random(seed).random)  # type: ignore[assignment]
    vmc = VCollector(cfg.sample_rate)
    omc = bp.KVCacheMetricsCollector(cfg.sample_rate, clock=clock, rng=random.Random(seed).random)
    vpool = VBlockPool(cfg.num_blocks, True, cfg.hash_block_size, True, vmc)
    opool = bp.BlockPool(cfg.num_blocks, True, cfg.hash_block_size, True, omc)

    vhasher = vllm_utils.get_request_block_hasher(cfg.hash_block_size, vllm_fn)
    ohasher = bp.get_request_block_hasher(cfg.hash_block_size, our_fn)

    def vreq(rid: str, tokens: list[int], lora: Any, salt: Any, mm: Any, emb: Any = None) -> Any:
        return VRequest(
            rid,
            list(tokens),
            SamplingParams(max_tokens=1 << 20),
            None,
            None,
            block_hasher=vhasher,
            lora_request=VLoRARequest(lora[0], lora[1], "/adapters/" + lora[0]) if lora else None,
            cache_salt=salt,
            mm_features=[
                VMMFeature(
                    data=None, modality="image", identifier=i, mm_position=VPlaceholder(o, n)
                )
                for i, o, n in mm
            ]
            or None,
            prompt_embeds=emb,
        )

    def oreq(rid: str, tokens: list[int], lora: Any, salt: Any, mm: Any, emb: Any = None) -> Any:
        return bp.Request(
            rid,
            list(tokens),
            block_hasher=ohasher,
            lora_request=bp.LoRARequest(lora[0], lora[1]) if lora else None,
            cache_salt=salt,
            mm_features=[bp.MultiModalFeature(i, bp.PlaceholderRange(o, n)) for i, o, n in mm],
            prompt_embeds=emb,
        )

    return Side("vllm", vpool, vmc, vreq), Side("ours", opool, omc, oreq)


# ------------------------------------------------------------- snapshots


def queue_ids(pool: Any) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def map_view(pool: Any) -> dict[bytes, tuple[str, list[int]]]:
    out = {}
    for key, entry in pool.cached_block_hash_to_block._cache.items():
        if isinstance(entry, dict):
            out[key] = ("dict", list(entry))
        else:
            out[key] = ("one", [entry.block_id])
    return out


def event_view(ev: Any) -> tuple[Any, ...]:
    fields = ev.__struct_fields__
    return (type(ev).__name__, fields, tuple(getattr(ev, f) for f in fields))


def metrics_view(mc: Any) -> Any:
    states = {
        bid: (s.birth_time_ns, s.last_access_ns, list(s.access_history))
        for bid, s in mc.block_metrics.items()
    }
    return states, [sample_view(e) for e in mc._eviction_events]


def sample_view(e: Any) -> tuple[float, float, tuple[float, ...]]:
    return (e.lifetime_seconds, e.idle_seconds, tuple(e.reuse_gaps_seconds))


# ----------------------------------------------------------------- driver


@dataclass
class Req:
    rid: str
    sides: tuple[Any, Any]  # (vLLM Request, our Request)
    tables: list[list[int]]  # block ids per group
    cached: list[int]  # num cached blocks per group


@dataclass
class RunStats:
    ops: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    events: int = 0
    samples: int = 0
    hits: int = 0
    errors_matched: int = 0

    def bump(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


class Driver:
    def __init__(self, cfg: Config, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.rng = random.Random(seed * 1000 + zlib.crc32(cfg.name.encode()) % 997)
        self.clock = Clock()
        self.v, self.o = make_sides(cfg, seed, self.clock)
        self.reqs: list[Req] = []
        self.pins: list[list[int]] = []  # extra touches, per group 0
        self.next_id = 0
        self.seen_events = 0
        self.stats = RunStats()
        rng = self.rng
        hb = cfg.hash_block_size
        self.docs = [
            [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12) * hb * 3)] for _ in range(8)
        ]
        self.prompts: list[tuple[list[int], Any, Any, Any]] = []
        self.op = "start"

    # ------------------------------------------------------------ helpers

    def both(self, fn: Callable[[Side], Any], what: str) -> Any:
        """Run fn on both sides; results (or exception type+message) must match."""
        out = []
        for side in (self.v, self.o):
            try:
                out.append(("ok", fn(side)))
            except AssertionError as e:
                # vLLM's bare asserts carry no message; ours explain themselves.
                out.append(("raised", ("AssertionError", "")))
                del e
            except Exception as e:  # compared, not swallowed
                out.append(("raised", (type(e).__name__, str(e))))
        if out[0] != out[1]:
            self.fail(f"{what}: vllm -> {out[0]!r}, ours -> {out[1]!r}")
        if out[0][0] == "raised":
            self.stats.errors_matched += 1
            return _Raised(out[0][1])
        return out[0][1]

    def fail(self, msg: str) -> None:
        raise Divergence(
            f"[{self.cfg.name}, seed {self.seed}, op {self.stats.ops} {self.op}] {msg}"
        )

    def blocks(self, side: Side, ids: Sequence[int]) -> list[Any]:
        return [side.pool.blocks[i] for i in ids]

    def compare(self) -> None:
        v, o = self.v.pool, self.o.pool
        if queue_ids(v) != queue_ids(o):
            self.fail(f"free queue: vllm {queue_ids(v)} ours {queue_ids(o)}")
        vb = [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in v.blocks]
        ob = [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in o.blocks]
        if vb != ob:
            diff = [(x, y) for x, y in zip(vb, ob, strict=True) if x != y][:4]
            self.fail(f"blocks differ (vllm, ours): {diff}")
        if map_view(v) != map_view(o):
            self.fail("hash map contents differ")
        if list(v.cached_block_hash_to_block._cache) != list(o.cached_block_hash_to_block._cache):
            self.fail("hash map key order differs")
        if (v.get_num_free_blocks(), v.get_usage()) != (o.get_num_free_blocks(), o.get_usage()):
            self.fail("free count / usage differ")
        ve, oe = v.kv_event_queue, o.kv_event_queue
        if len(ve) != len(oe):
            self.fail(f"{len(ve)} pending events in vllm, {len(oe)} in ours")
        for i in range(self.seen_events, len(ve)):
            if event_view(ve[i]) != event_view(oe[i]):
                self.fail(f"event {i}: vllm {event_view(ve[i])} ours {event_view(oe[i])}")
        self.seen_events = len(ve)
        if metrics_view(self.v.mc) != metrics_view(self.o.mc):
            self.fail("metrics states or pending samples differ")
        bp.check_invariants(o)

    def check_hashes(self, r: Req) -> None:
        vh, oh = list(r.sides[0].block_hashes), list(r.sides[1].block_hashes)
        if vh != oh:
            self.fail(f"request {r.rid}: block hashes differ ({len(vh)} vs {len(oh)})")

    def view(self, hashes: Any, bs: int) -> Any:
        hb = self.cfg.hash_block_size
        return hashes if bs == hb else vllm_utils.BlockHashListWithBlockSize(hashes, hb, bs)

    # -------------------------------------------------------------- ops

    def new_prompt(self) -> tuple[list[int], Any, Any, Any, Any]:
        rng = self.rng
        if self.prompts and rng.random() < 0.2:
            return rng.choice(self.prompts)
        tokens = list(rng.choice(self.docs)) if rng.random() < 0.85 else []
        if tokens and rng.random() < 0.5:
            tokens = tokens[: rng.randint(1, len(tokens))]
        tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
        lora = rng.choice([("sql", 3), ("chat", 9)]) if rng.random() < 0.12 else None
        salt = rng.choice(["tenant-a", "tenant-b"]) if rng.random() < 0.06 else None
        mm: list[tuple[str, int, int]] = []
        if rng.random() < 0.1:
            off = rng.randrange(len(tokens))
            while off < len(tokens) and len(mm) < 3:
                n = rng.randint(1, 9)
                mm.append((f"img{rng.randrange(4)}", off, n))
                off += n + rng.randint(0, 6)
        emb = None
        if rng.random() < 0.06:  # prompt embeddings: a few distinct tensors
            gen = torch.Generator().manual_seed(rng.randrange(3))
            dtype = rng.choice([torch.float16, torch.bfloat16, torch.float32])
            emb = torch.randn(len(tokens), 4, generator=gen).to(dtype)
        prompt = (tokens, lora, salt, mm, emb)
        self.prompts.append(prompt)
        return prompt

    def admit(self) -> None:
        rng, cfg = self.rng, self.cfg
        tokens, lora, salt, mm, emb = self.new_prompt()
        rid = f"r{self.next_id}"
        self.next_id += 1
        if emb is not None:
            self.stats.bump("admit prompt embeds")
        sides = (
            self.v.make_request(rid, tokens, lora, salt, mm, emb),
            self.o.make_request(rid, tokens, lora, salt, mm, emb),
        )
        r = Req(rid, sides, [[] for _ in cfg.groups], [0] * len(cfg.groups))
        self.check_hashes(r)
        skip_cache = rng.random() < 0.15  # e.g. prompt logprobs: no prefix hit
        sparse = rng.random() < 0.08  # sliding-window style: leading null blocks
        ntok = len(tokens)

        # Prefix lookup, as the KV-cache manager does it.
        hits: list[list[int]] = [[] for _ in cfg.groups]
        if not skip_cache and not sparse:
            if cfg.uniform:
                bs = cfg.groups[0][1]
                hv = self.view(sides[0].block_hashes, bs)
                gids = [g for g, _ in cfg.groups]
                for i in range(min((ntok - 1) // bs, len(hv))):
                    got = self.both(
                        lambda s, h=hv[i]: ids_of(s.pool.get_cached_block(h, gids)),
                        "get_cached_block",
                    )
                    if got is None:
                        break
                    for j, bid in enumerate(got):
                        hits[j].append(bid)
            else:
                for j, (gid, bs) in enumerate(cfg.groups):
                    hv = self.view(sides[0].block_hashes, bs)
                    for i in range(min((ntok - 1) // bs, len(hv))):
                        got = self.both(
                            lambda s, h=hv[i], g=gid: ids_of(s.pool.get_cached_block(h, [g])),
                            "get_cached_block",
                        )
                        if got is None:
                            break
                        hits[j].append(got[0])
        need = 0
        nulls = []
        for j, (_, bs) in enumerate(cfg.groups):
            total = -(-ntok // bs)
            k = rng.randint(1, max(total - 1, 1)) if sparse and total > 1 else 0
            nulls.append(k)
            need += total - len(hits[j]) - k
        evictable = {b for t in hits for b in t if self.o.pool.blocks[b].ref_cnt == 0}
        free = self.both(lambda s: s.pool.get_num_free_blocks(), "get_num_free_blocks")
        if need + len(evictable) > free:
            self.stats.bump("admit refused")
            if self.reqs:
                self.finish(self.reqs.pop(), "reverse")  # preempt the newest
            return
        for j in range(len(cfg.groups)):
            self.both(lambda s, h=hits[j]: s.pool.touch(self.blocks(s, h)), "touch")
            self.stats.hits += len(hits[j])
        for j, (gid, bs) in enumerate(cfg.groups):
            total = -(-ntok // bs)
            n = total - len(hits[j]) - nulls[j]
            new = self.both(lambda s, n=n: ids_of(s.pool.get_new_blocks(n)), "get_new_blocks")
            r.tables[j] = hits[j] + [0] * nulls[j] + new
            full = ntok // bs
            start = len(hits[j])
            self.both(
                lambda s, t=r.tables[j], a=start, b=full, g=gid, z=bs, rr=r: (
                    s.pool.cache_full_blocks(
                        rr.sides[0] if s is self.v else rr.sides[1], self.table(s, t), a, b, z, g
                    )
                ),
                "cache_full_blocks",
            )
            r.cached[j] = max(full, start)
        self.reqs.append(r)
        self.stats.bump(
            "admit" + (" no-cache" if skip_cache else "") + (" sparse" if sparse else "")
        )

    def table(self, side: Side, ids: list[int]) -> list[Any]:
        pool = side.pool
        return [pool.null_block if i == 0 else pool.blocks[i] for i in ids]

    def decode(self) -> None:
        rng, cfg = self.rng, self.cfg
        r = rng.choice(self.reqs)
        new = [rng.randrange(VOCAB) for _ in range(rng.choice([1, 1, 2, 3, 7]))]
        ntok = r.sides[1].num_tokens + len(new)
        need = sum(-(-ntok // bs) - len(r.tables[j]) for j, (_, bs) in enumerate(cfg.groups))
        free = self.both(lambda s: s.pool.get_num_free_blocks(), "get_num_free_blocks")
        if need > free:
            self.reqs.remove(r)
            self.finish(r, "reverse")  # preempted
            self.stats.bump("preempted")
            return
        for side_req in r.sides:
            side_req.append_output_token_ids(list(new))
        self.check_hashes(r)
        for j, (gid, bs) in enumerate(cfg.groups):
            n = -(-ntok // bs) - len(r.tables[j])
            if n > 0:
                got = self.both(lambda s, n=n: ids_of(s.pool.get_new_blocks(n)), "get_new_blocks")
                r.tables[j] += got
            full = ntok // bs
            self.both(
                lambda s, t=r.tables[j], a=r.cached[j], b=full, g=gid, z=bs: (
                    s.pool.cache_full_blocks(
                        r.sides[0] if s is self.v else r.sides[1], self.table(s, t), a, b, z, g
                    )
                ),
                "cache_full_blocks",
            )
            r.cached[j] = max(r.cached[j], full)
        self.stats.bump("decode")

    def finish(self, r: Req, order: str) -> None:
        rng = self.rng
        for j in range(len(self.cfg.groups)):
            ids = list(r.tables[j])
            if order == "reverse":
                ids.reverse()
            elif order == "shuffle":
                rng.shuffle(ids)
            self.both(lambda s, ids=ids: s.pool.free_blocks(self.table(s, ids)), "free_blocks")
        self.stats.bump(f"free {order}")

    def finish_op(self) -> None:
        rng = self.rng
        x = rng.random()
        pair = self._disjoint_pair() if x < 0.12 else None
        if pair is not None:
            # Two requests' reversed tables in one call (group by group).  Only
            # requests that share no block: vLLM 0.16 corrupts its free list
            # when one call lists a block twice and it reaches 0 (it appends
            # it twice); ours queues it once, at its last mention.
            a, b = pair
            self.reqs.remove(a)
            self.reqs.remove(b)
            for j in range(len(self.cfg.groups)):
                ids = a.tables[j][::-1] + b.tables[j][::-1]
                self.both(
                    lambda s, ids=ids: s.pool.free_blocks(iter(self.table(s, ids))),
                    "free_blocks",
                )
            self.stats.bump("free two tables")
            return
        r = self.reqs.pop(rng.randrange(len(self.reqs)))
        self.finish(r, "reverse" if x < 0.75 else "forward" if x < 0.88 else "shuffle")

    def _disjoint_pair(self) -> tuple[Req, Req] | None:
        if len(self.reqs) < 2:
            return None
        a, b = self.rng.sample(self.reqs, 2)
        ids_a = {i for t in a.tables for i in t if i}
        if any(i in ids_a for t in b.tables for i in t):
            return None
        return a, b

    def touch_extra(self) -> None:
        """Another hit on a cached block (e.g. a parallel sampling branch)."""
        keys = list(self.o.pool.cached_block_hash_to_block._cache)
        if not keys:
            return
        key = self.rng.choice(keys)
        h, gid = bp.get_block_hash(key), bp.get_group_id(key)
        got = self.both(lambda s: ids_of(s.pool.get_cached_block(h, [gid])), "get_cached_block")
        self.both(lambda s: s.pool.touch(self.blocks(s, got)), "touch")
        self.pins.append(got)
        self.stats.bump("touch extra")

    def unpin(self) -> None:
        ids = self.pins.pop(self.rng.randrange(len(self.pins)))
        self.both(lambda s: s.pool.free_blocks(self.blocks(s, ids)), "free_blocks")
        self.stats.bump("unpin")

    def evict(self) -> None:
        rng, n = self.rng, self.cfg.num_blocks
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 6))]
        if rng.random() < 0.3:
            ids.append(ids[0])  # repeated id
        if rng.random() < 0.15:
            ids.append(n + rng.randrange(3))  # out of range: an assertion on both
            self.stats.bump("evict out of range")
        self.both(lambda s: s.pool.evict_blocks(list(ids)), "evict_blocks")
        self.stats.bump("evict_blocks")

    def lookup(self) -> None:
        rng = self.rng
        keys = list(self.o.pool.cached_block_hash_to_block._cache)
        if keys and rng.random() < 0.7:
            h = bp.get_block_hash(rng.choice(keys))
        else:
            r = rng.choice(self.reqs) if self.reqs else None
            if r is None or not r.sides[0].block_hashes:
                return
            h = rng.choice(list(r.sides[0].block_hashes))
        known = [g for g, _ in self.cfg.groups]
        gids = [rng.choice(known) for _ in range(rng.randint(0, len(known) + 1))]
        if rng.random() < 0.2:
            gids.insert(rng.randint(0, len(gids)), 7)  # a group that holds nothing
        got = self.both(lambda s: ids_of(s.pool.get_cached_block(h, gids)), "get_cached_block")
        self.stats.bump("lookup hit" if got else "lookup miss")

    def reset(self, drain: bool) -> None:
        if drain:
            while self.reqs:
                self.finish(self.reqs.pop(), "reverse")
            while self.pins:
                self.unpin()
        ok = self.both(lambda s: s.pool.reset_prefix_cache(), "reset_prefix_cache")
        self.stats.bump("reset accepted" if ok else "reset refused")

    def take_events(self) -> None:
        taken = self.both(lambda s: [event_view(e) for e in s.pool.take_events()], "take_events")
        self.seen_events = 0
        self.stats.events += len(taken)
        self.stats.bump("take_events")

    def wire(self) -> None:
        """The msgpack bytes of a batch must be equal."""
        vev = self.v.pool.take_events()
        oev = self.o.pool.take_events()
        self.seen_events = 0
        if [event_view(e) for e in vev] != [event_view(e) for e in oev]:
            self.fail("taken events differ")
        rank = self.rng.choice([None, 0, 3])
        vbytes = msgspec.msgpack.Encoder().encode(
            VKVEventBatch(ts=12.5, events=vev, data_parallel_rank=rank)
        )
        obytes = bp.encode_event_batch(
            bp.KVEventBatch(ts=12.5, events=oev, data_parallel_rank=rank)
        )
        if vbytes != obytes:
            self.fail("event batch wire bytes differ")
        back = bp.decode_event_batch(vbytes)
        if [event_view(e) for e in back.events] != [event_view(e) for e in oev]:
            self.fail("our decoder does not read vLLM's batch back")
        self.stats.events += len(vev)
        self.stats.bump("wire")

    def drain_metrics(self) -> None:
        got = self.both(lambda s: [sample_view(e) for e in s.mc.drain_events()], "drain_events")
        self.stats.samples += len(got)
        self.stats.bump("drain metrics")

    def too_many(self) -> None:
        n = self.o.pool.get_num_free_blocks() + self.rng.randint(1, 3)
        self.both(lambda s: s.pool.get_new_blocks(n), "get_new_blocks(too many)")
        self.stats.bump("get_new_blocks too many")

    def recache(self) -> None:
        """cache_full_blocks over an already cached range: an assertion on both
        sides, after the same partial work."""
        cands = [r for r in self.reqs if r.cached[0] > 0]
        if not cands:
            return
        r = self.rng.choice(cands)
        gid, bs = self.cfg.groups[0]
        a = self.rng.randrange(r.cached[0])
        self.both(
            lambda s: s.pool.cache_full_blocks(
                r.sides[0] if s is self.v else r.sides[1],
                self.table(s, r.tables[0]),
                a,
                r.cached[0],
                bs,
                gid,
            ),
            "cache_full_blocks(again)",
        )
        self.stats.bump("recache")

    def slide(self) -> None:
        """Sliding window: free a request's oldest blocks, null in their place."""
        cands = [r for r in self.reqs if any(b for b in r.tables[0][:-1])]
        if not cands:
            return
        r = self.rng.choice(cands)
        for j in range(len(self.cfg.groups)):
            t = r.tables[j]
            k = self.rng.randint(1, max(len(t) - 1, 1))
            gone = [b for b in t[:k] if b != 0]
            self.both(lambda s, g=gone: s.pool.free_blocks(self.blocks(s, g[::-1])), "free_blocks")
            t[:k] = [0] * k
        self.stats.bump("slide")

    # -------------------------------------------------------------- run

    def step(self) -> None:
        rng = self.rng
        self.clock.now += rng.randint(1, 5_000_000)
        x = rng.random()
        if x < 0.27 or not self.reqs:
            self.op = "admit"
            self.admit()
        elif x < 0.55:
            self.op = "decode"
            self.decode()
        elif x < 0.70:
            self.op = "finish"
            self.finish_op()
        elif x < 0.74:
            self.op = "touch"
            self.touch_extra()
        elif x < 0.77 and self.pins:
            self.op = "unpin"
            self.unpin()
        elif x < 0.81:
            self.op = "evict"
            self.evict()
        elif x < 0.85:
            self.op = "lookup"
            self.lookup()
        elif x < 0.865:
            self.op = "reset"
            self.reset(drain=False)
        elif x < 0.872:
            self.op = "drain+reset"
            self.reset(drain=True)
        elif x < 0.90:
            self.op = "take_events"
            self.take_events()
        elif x < 0.92:
            self.op = "wire"
            self.wire()
        elif x < 0.94:
            self.op = "drain metrics"
            self.drain_metrics()
        elif x < 0.95:
            self.op = "too many"
            self.too_many()
        elif x < 0.96:
            self.op = "recache"
            self.recache()
        elif x < 0.975:
            self.op = "slide"
            self.slide()
        else:
            self.op = "get_usage"
            self.both(lambda s: s.pool.get_usage(), "get_usage")
        self.compare()
        self.stats.ops += 1

    def run(self, ops: int) -> RunStats:
        self.compare()
        for _ in range(ops):
            self.step()
        self.op = "final drain"
        self.reset(drain=True)
        self.wire()
        self.drain_metrics()
        self.compare()
        return self.stats


# -------------------------------------------------- the request level


@dataclass(frozen=True)
class ManagerConfig:
    name: str
    num_blocks: int
    block_size: int
    groups: int = 1


# One group: vLLM puts identical full-attention layers in one group, and its
# hybrid coordinator wants different attention types (multi-group lookups are
# compared at the pool level above).
MANAGER_CONFIGS = [
    ManagerConfig("manager, one group", 300, 16),
    ManagerConfig("manager, small blocks", 120, 4),
    ManagerConfig("manager, tiny pool", 40, 8),
]


class ManagerDriver:
    """Our RequestManager against vLLM's KVCacheManager (full attention):
    admit = get_computed_blocks + allocate_slots, decode = append + allocate
    the new token's slot, finish = free."""

    def __init__(self, cfg: ManagerConfig, seed: int) -> None:
        self.cfg, self.seed = cfg, seed
        self.rng = random.Random(seed * 7919 + cfg.num_blocks)
        bp.init_none_hash(bp.sha256, seed="0")
        vllm_utils.init_none_hash(vllm_hashing.sha256)
        os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "1"
        bp.set_int_block_hashes(True)
        bs = cfg.block_size
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16)
        kv_config = KVCacheConfig(
            num_blocks=cfg.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec([f"layer{g}"], spec) for g in range(cfg.groups)],
        )
        self.vm = VKVCacheManager(
            kv_config, max_model_len=1 << 16, hash_block_size=bs, enable_caching=True,
            log_stats=True, enable_kv_cache_events=True,
        )  # fmt: skip
        self.opool = bp.BlockPool(cfg.num_blocks, True, bs, enable_kv_cache_events=True)
        self.om = bp.RequestManager(self.opool, group_ids=range(cfg.groups))  # type: ignore[arg-type]
        self.vhasher = vllm_utils.get_request_block_hasher(bs, vllm_hashing.sha256)
        self.vreqs: dict[str, Any] = {}
        self.docs = [[self.rng.randrange(VOCAB) for _ in range(bs * self.rng.randint(1, 10))]
                     for _ in range(6)]  # fmt: skip
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.stats = RunStats()
        self.op = "start"

    def fail(self, msg: str) -> None:
        raise Divergence(
            f"[{self.cfg.name}, seed {self.seed}, op {self.stats.ops} {self.op}] {msg}"
        )

    def compare(self) -> None:
        v, o = self.vm.block_pool, self.opool
        if queue_ids(v) != queue_ids(o):
            self.fail(f"free queue: vllm {queue_ids(v)} ours {queue_ids(o)}")
        vb = [(b.ref_cnt, b.block_hash) for b in v.blocks]
        if vb != [(b.ref_cnt, b.block_hash) for b in o.blocks]:
            self.fail("ref counts or hashes differ")
        if map_view(v) != map_view(o):
            self.fail("hash map contents differ")
        ve = [event_view(e) for e in v.take_events()]
        oe = [event_view(e) for e in o.take_events()]
        if ve != oe:
            self.fail(f"events differ: vllm {ve[:3]} ours {oe[:3]}")
        self.stats.events += len(ve)
        for rid, vr in self.vreqs.items():
            vids = [list(t) for t in self.vm.get_block_ids(rid)]
            if vids != self.om.get(rid).block_ids():
                self.fail(
                    f"{rid}: block tables differ: vllm {vids} ours {self.om.get(rid).block_ids()}"
                )
            if list(vr.block_hashes) != self.om.block_hashes_of(rid):
                self.fail(f"{rid}: block hashes differ")
        bp.check_invariants(o)

    def admit(self) -> None:
        rng = self.rng
        if self.prompts and rng.random() < 0.25:
            tokens = rng.choice(self.prompts)
        else:
            tokens = list(rng.choice(self.docs)) if rng.random() < 0.8 else []
            if tokens and rng.random() < 0.4:
                tokens = tokens[: rng.randint(1, len(tokens))]
            tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 40))]
            if not tokens:
                tokens = [1]
            self.prompts.append(tokens)
        lora = ("sql", 5) if rng.random() < 0.1 else None
        salt = "tenant" if rng.random() < 0.05 else None
        rid = f"r{self.next_id}"
        self.next_id += 1
        vr = VRequest(
            rid, list(tokens), SamplingParams(max_tokens=1 << 20), None, None,
            block_hasher=self.vhasher, cache_salt=salt,
            lora_request=VLoRARequest(lora[0], lora[1], "/x") if lora else None,
        )  # fmt: skip
        computed, n = self.vm.get_computed_blocks(vr)
        got = self.vm.allocate_slots(vr, vr.num_tokens - n, n, computed)
        try:
            adm = self.om.admit(
                rid,
                tokens,
                lora_name=lora[0] if lora else None,
                lora_id=lora[1] if lora else 1,
                cache_salt=salt,
            )
        except bp.NotEnoughBlocksError:
            adm = None
        if (got is None) != (adm is None):
            self.fail(f"vllm {'refused' if got is None else 'admitted'}, ours did not")
        if adm is None:
            self.stats.bump("refused")
            if self.vreqs:  # preempt the newest on both
                self.finish(list(self.vreqs)[-1])
            return
        if adm.num_computed_tokens != n:
            self.fail(f"{rid}: vllm computed {n} tokens, ours {adm.num_computed_tokens}")
        vr.num_computed_tokens = vr.num_tokens
        self.vreqs[rid] = vr
        self.stats.hits += adm.num_hit_blocks
        self.stats.bump("admit")

    def decode(self) -> None:
        rid = self.rng.choice(list(self.vreqs))
        vr = self.vreqs[rid]
        k = self.rng.choice([1, 1, 1, 2, 5])
        new = [self.rng.randrange(VOCAB) for _ in range(k)]
        vr.append_output_token_ids(list(new))
        got = self.vm.allocate_slots(vr, k)
        try:
            self.om.append_tokens(rid, new)
            ours_ok = True
        except bp.NotEnoughBlocksError:
            ours_ok = False
        if (got is not None) != ours_ok:
            self.fail("decode: one side could not allocate")
        if got is None:
            del vr._all_token_ids[-k:], vr._output_token_ids[-k:]
            self.finish(rid)
            self.stats.bump("preempted")
            return
        vr.num_computed_tokens = vr.num_tokens
        self.stats.bump("decode")

    def finish(self, rid: str) -> None:
        self.vm.free(self.vreqs.pop(rid))
        self.om.finish(rid)
        self.stats.bump("finish")

    def run(self, ops: int) -> RunStats:
        rng = self.rng
        for _ in range(ops):
            x = rng.random()
            if x < 0.35 or not self.vreqs:
                self.op = "admit"
                self.admit()
            elif x < 0.8:
                self.op = "decode"
                self.decode()
            elif x < 0.99:
                self.op = "finish"
                self.finish(rng.choice(list(self.vreqs)))
            else:
                self.op = "reset"
                while self.vreqs:
                    self.finish(next(iter(self.vreqs)))
                if self.vm.reset_prefix_cache() is not self.opool.reset_prefix_cache():
                    self.fail("reset_prefix_cache differs")
            self.compare()
            self.stats.ops += 1
        vstats = self.vm.make_prefix_cache_stats()
        self.stats.bump("vllm queries (incl. refused)", vstats.queries if vstats else 0)
        return self.stats


class _Raised(tuple):  # type: ignore[type-arg]
    """An exception both sides raised alike (type name, message)."""


def ids_of(blocks: Any) -> Any:
    return None if blocks is None else [b.block_id for b in blocks]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=6, help="seeds per configuration")
    p.add_argument("--ops", type=int, default=3000, help="operations per run")
    p.add_argument("--first-seed", type=int, default=1)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    failures = 0
    total_ops = total_events = total_samples = total_hits = total_errors = 0
    counts: dict[str, int] = {}
    for cfg in CONFIGS:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t = time.perf_counter()
            try:
                st = Driver(cfg, seed).run(args.ops)
            except Divergence as e:
                failures += 1
                print(f"DIVERGENCE {e}")
                continue
            total_ops += st.ops
            total_events += st.events
            total_samples += st.samples
            total_hits += st.hits
            total_errors += st.errors_matched
            for k, v in st.counts.items():
                counts[k] = counts.get(k, 0) + v
            print(
                f"  ok  {cfg.name:<24} seed {seed}: {st.ops} ops, {st.events} events, "
                f"{st.samples} metric samples, {st.hits} hit blocks, "
                f"{st.errors_matched} matching errors ({time.perf_counter() - t:.1f}s)",
                flush=True,
            )
    for mcfg in MANAGER_CONFIGS:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            t = time.perf_counter()
            try:
                st = ManagerDriver(mcfg, seed).run(args.ops)
            except Divergence as e:
                failures += 1
                print(f"DIVERGENCE {e}")
                continue
            total_ops += st.ops
            total_events += st.events
            total_hits += st.hits
            print(
                f"  ok  {mcfg.name:<24} seed {seed}: {st.ops} ops, {st.events} events, "
                f"{st.hits} hit blocks, {st.counts.get('admit', 0)} admitted, "
                f"{st.counts.get('refused', 0)} refused, {st.counts.get('preempted', 0)} "
                f"preempted ({time.perf_counter() - t:.1f}s)",
                flush=True,
            )
    bp.set_int_block_hashes(True)
    print()
    print("operations exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    runs = (len(CONFIGS) + len(MANAGER_CONFIGS)) * args.seeds
    print(
        f"{runs - failures}/{runs} runs identical: {total_ops} ops, {total_events} events, "
        f"{total_samples} metric samples, {total_hits} hit blocks, {total_errors} errors raised "
        f"alike, in {time.perf_counter() - t0:.1f}s"
    )
    if failures:
        print(f"FAILED: {failures} run(s) diverged from vLLM 0.16.0")
        return 1
    print("OK: blockpool matches vLLM 0.16.0 call for call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
