"""vLLM 0.16.0's BlockPool and ours as a pair: the configurations, how each
side is built (pool, metrics collector on a shared clock, request factory),
and the comparison of the two after every call.
"""

from __future__ import annotations

import os
import random
import types
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import vllm.envs as vllm_envs
import vllm.v1.core.kv_cache_metrics as vllm_metrics_mod
from vllm.lora.request import LoRARequest as VLoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec as VMMFeature
from vllm.multimodal.inputs import PlaceholderRange as VPlaceholder
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils as vllm_utils
from vllm.v1.core.block_pool import BlockPool as VBlockPool
from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VCollector
from vllm.v1.request import Request as VRequest

import blockpool as bp

from .common import Divergence, Run, event_view

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


def metrics_view(mc: Any) -> Any:
    states = {
        bid: (s.birth_time_ns, s.last_access_ns, list(s.access_history))
        for bid, s in mc.block_metrics.items()
    }
    return states, [sample_view(e) for e in mc._eviction_events]


def sample_view(e: Any) -> tuple[float, float, tuple[float, ...]]:
    return (e.lifetime_seconds, e.idle_seconds, tuple(e.reuse_gaps_seconds))


def ids_of(blocks: Any) -> Any:
    return None if blocks is None else [b.block_id for b in blocks]


class Raised(tuple):  # type: ignore[type-arg]
    """An exception both sides raised alike (type name, message)."""


# ------------------------------------------------------------------ pair


@dataclass
class Req:
    rid: str
    sides: tuple[Any, Any]  # (vLLM Request, our Request)
    tables: list[list[int]]  # block ids per group
    cached: list[int]  # num cached blocks per group


class PoolPair(Run):
    """The two sides of one run and the calls and checks made on both."""

    def __init__(self, cfg: Config, seed: int) -> None:
        super().__init__(cfg.name, seed)
        self.cfg = cfg
        self.rng = random.Random(seed * 1000 + zlib.crc32(cfg.name.encode()) % 997)
        self.clock = Clock()
        self.v, self.o = make_sides(cfg, seed, self.clock)
        self.reqs: list[Req] = []
        self.seen_events = 0

    def both(self, fn: Callable[[Side], Any], what: str) -> Any:
        """Run fn on both sides; results (or exception type+message) must match."""
        out = []
        for side in (self.v, self.o):
            try:
                out.append(("ok", fn(side)))
            except AssertionError:
                # vLLM's bare asserts carry no message; ours explain themselves.
                out.append(("raised", ("AssertionError", "")))
            except Exception as e:  # compared, not swallowed
                out.append(("raised", (type(e).__name__, str(e))))
        if out[0] != out[1]:
            self.fail(f"{what}: vllm -> {out[0]!r}, ours -> {out[1]!r}")
        if out[0][0] == "raised":
            self.stats.errors_matched += 1
            return Raised(out[0][1])
        return out[0][1]

    # the calls the drivers make on both, by name

    def free_count(self) -> Any:
        return self.both(lambda s: s.pool.get_num_free_blocks(), "get_num_free_blocks")

    def new_blocks(self, n: int) -> Any:
        return self.both(lambda s: ids_of(s.pool.get_new_blocks(n)), "get_new_blocks")

    def cached_ids(self, h: Any, gids: list[int]) -> Any:
        return self.both(lambda s: ids_of(s.pool.get_cached_block(h, gids)), "get_cached_block")

    def touch(self, ids: list[int]) -> None:
        self.both(lambda s: s.pool.touch(self.blocks(s, ids)), "touch")

    def cache_full(
        self, r: Req, j: int, start: int, end: int, what: str = "cache_full_blocks"
    ) -> None:
        """cache_full_blocks of ``r``'s table in group ``j``, blocks [start, end)."""
        gid, bs = self.cfg.groups[j]
        ids = r.tables[j]
        self.both(
            lambda s: s.pool.cache_full_blocks(
                self.request(s, r), self.table(s, ids), start, end, bs, gid
            ),
            what,
        )

    # side by side

    def blocks(self, side: Side, ids: Sequence[int]) -> list[Any]:
        return [side.pool.blocks[i] for i in ids]

    def table(self, side: Side, ids: list[int]) -> list[Any]:
        pool = side.pool
        return [pool.null_block if i == 0 else pool.blocks[i] for i in ids]

    def request(self, side: Side, r: Req) -> Any:
        """``side``'s own request of ``r``."""
        return r.sides[0] if side is self.v else r.sides[1]

    def view(self, hashes: Any, bs: int) -> Any:
        hb = self.cfg.hash_block_size
        return hashes if bs == hb else vllm_utils.BlockHashListWithBlockSize(hashes, hb, bs)

    def compare(self) -> None:
        v, o = self.v.pool, self.o.pool
        self.same_free_queue(v, o)
        vb = [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in v.blocks]
        ob = [(b.block_id, b.ref_cnt, b.block_hash, b.is_null) for b in o.blocks]
        if vb != ob:
            diff = [(x, y) for x, y in zip(vb, ob, strict=True) if x != y][:4]
            self.fail(f"blocks differ (vllm, ours): {diff}")
        self.same_hash_map(v, o)
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
