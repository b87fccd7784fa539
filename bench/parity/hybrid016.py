"""KV-cache groups: vLLM 0.16.0's KVCacheManager with a KVCacheConfig of
several groups (FullAttentionSpec / SlidingWindowSpec) against our
KVCacheCoordinator over one BlockPool, with the same requests.

Operations, each picked at random: admit (a prompt over shared documents:
get_computed_blocks / find_longest_cache_hit, then allocate_slots for the
whole prompt or only its first chunk), prefill the next chunk of a request
admitted in part, decode (append 1-5 tokens, allocate their slots: where
windows free blocks), re-admit a preempted request (its decoded tokens
included), drop the blocks left of the window (remove_skipped_blocks, as
vLLM does before handing a finished request to a connector), finish, and
reset_prefix_cache.  A refused chunk or decode preempts the newest request
(freed, sent back to wait with its computed tokens at 0) and tries again, as
vLLM's scheduler does, until it fits or the request itself was preempted; a
refused admission sends the request to wait and preempts the newest once.

After every operation: the free queue order, every block's ref count and
hash, the hash map, the KV events taken, every request's block table in
every group, the new blocks each allocation hands out, and the invariants
of our pool and coordinator; at every lookup the hit tokens and the hit block
ids per group.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils as vllm_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager as VKVCacheManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import Request as VRequest

import blockpool as bp
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, GroupSpec
from blockpool.core.coordinator import KVCacheCoordinator
from blockpool.core.invariants import check_coordinator

from .common import Run, RunStats
from .manager016 import same_hashing

VOCAB = 200  # small, so unrelated prompts share blocks now and then


def full(block_size: int) -> GroupSpec:
    return GroupSpec(FULL_ATTENTION, block_size)


def window(tokens: int, block_size: int) -> GroupSpec:
    return GroupSpec(SLIDING_WINDOW, block_size, tokens)


@dataclass(frozen=True)
class HybridConfig:
    name: str
    groups: tuple[GroupSpec, ...]
    num_blocks: int
    hash_block_size: int
    use_eagle: bool = False
    max_doc_blocks: int = 12  # documents of 1..this many hash blocks
    max_model_len: int = 1 << 16


HYBRID_CONFIGS = [
    HybridConfig("sliding only (Mistral)", (window(40, 16),), 60, 16),
    HybridConfig("full + sliding (Gemma)", (full(16), window(48, 16)), 80, 16),
    HybridConfig("full + 2 same windows", (full(8), window(24, 8), window(24, 8)), 150, 8),
    HybridConfig(
        "full + 3 windows", (full(8), window(20, 8), window(70, 8), window(20, 8)), 200, 8
    ),
    HybridConfig("two windows, no full", (window(17, 8), window(60, 8)), 90, 8),
    HybridConfig("window < block", (full(8), window(5, 8)), 70, 8),
    HybridConfig("window 2", (window(2, 4),), 40, 4),
    HybridConfig("window not a multiple", (full(4), full(4), window(37, 4)), 150, 4),
    HybridConfig("tiny pool", (full(8), window(24, 8)), 14, 8, max_doc_blocks=6),
    HybridConfig("tiny pool, 3 types", (full(4), window(9, 4), window(30, 4)), 22, 4),
    HybridConfig("eagle, full + sliding", (full(8), window(30, 8)), 90, 8, use_eagle=True),
    HybridConfig("eagle, sliding only", (window(33, 8),), 50, 8, use_eagle=True),
    HybridConfig("eagle, 3 types", (full(8), window(17, 8), window(40, 8)), 150, 8, True),
    HybridConfig("blocks 2x hash blocks", (full(16), window(40, 16)), 80, 8),
    HybridConfig("mixed sizes, window coarse", (full(8), window(40, 16)), 100, 8),
    HybridConfig("mixed sizes, full coarse", (full(16), window(21, 8)), 60, 8),
    HybridConfig("mixed sizes, 3 types", (full(8), window(12, 16), window(50, 8)), 160, 8),
    HybridConfig("short max_model_len", (full(8), window(20, 8)), 80, 8, max_model_len=64),
]


def vllm_spec(spec: GroupSpec) -> FullAttentionSpec | SlidingWindowSpec:
    shape: dict[str, Any] = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float16}
    if spec.sliding_window is None:
        return FullAttentionSpec(block_size=spec.block_size, **shape)
    return SlidingWindowSpec(
        block_size=spec.block_size, sliding_window=spec.sliding_window, **shape
    )


class HybridDriver(Run):
    """vLLM's KVCacheManager (the hybrid or unitary coordinator it builds)
    against our KVCacheCoordinator; one vLLM Request per request, read by
    both (our pool hashes nothing itself here, it files the request's
    hashes)."""

    def __init__(self, cfg: HybridConfig, seed: int) -> None:
        super().__init__(cfg.name, seed)
        self.cfg = cfg
        self.rng = random.Random(seed * 104729 + cfg.num_blocks)
        same_hashing()
        hbs = cfg.hash_block_size
        kv_config = KVCacheConfig(
            num_blocks=cfg.num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec([f"layer{i}"], vllm_spec(s)) for i, s in enumerate(cfg.groups)
            ],
        )
        self.vm = VKVCacheManager(
            kv_config, max_model_len=cfg.max_model_len, hash_block_size=hbs,
            enable_caching=True, use_eagle=cfg.use_eagle, log_stats=True,
            enable_kv_cache_events=True,
        )  # fmt: skip
        self.pool = bp.BlockPool(cfg.num_blocks, True, hbs, enable_kv_cache_events=True)
        self.co = KVCacheCoordinator(
            self.pool, cfg.groups, cfg.max_model_len, hash_block_size=hbs,
            use_eagle=cfg.use_eagle,
        )  # fmt: skip
        self.hasher = vllm_utils.get_request_block_hasher(hbs, vllm_hashing.sha256)
        lengths = [hbs * self.rng.randint(1, cfg.max_doc_blocks) for _ in range(5)]
        self.docs = [[self.rng.randrange(VOCAB) for _ in range(n)] for n in lengths]
        # live requests, oldest first; preempted ones wait to come back
        self.live: dict[str, Any] = {}
        self.waiting: list[Any] = []
        self.next_id = 0

    # ------------------------------------------------------------ checks

    def compare(self) -> None:
        v, o = self.vm.block_pool, self.pool
        self.same_pool_state(v, o)
        self.stats.events += self.same_taken_events(v, o)
        for vr in [*self.live.values(), *self.waiting]:
            self.same_tables(vr.request_id)
        bp.check_invariants(o)
        check_coordinator(self.co)

    def same_tables(self, rid: str) -> None:
        vids = [list(t) for t in self.vm.get_block_ids(rid)]
        if vids != self.co.block_ids(rid):
            self.fail(f"{rid}: block tables differ: vllm {vids} ours {self.co.block_ids(rid)}")

    # ------------------------------------------------------------ allocation

    def allocate(
        self, vr: Any, num_new: int, hit: int = 0, vhit: Any = None, ohit: Any = None
    ) -> bool:
        """allocate_slots on both: both refuse, or both hand out the same new
        blocks."""
        got = self.vm.allocate_slots(vr, num_new, hit, vhit)
        ours = self.co.allocate_slots(vr, num_new, hit, ohit)
        if (got is None) != (ours is None):
            self.fail(f"allocate_slots({num_new}): vllm {got is not None}, ours {ours is not None}")
        if got is None or ours is None:
            self.stats.bump("refused")
            return False
        vnew = [[b.block_id for b in g] for g in got.blocks]
        if vnew != [[b.block_id for b in g] for g in ours]:
            self.fail(f"new blocks: vllm {vnew} ours {self.co.block_ids(vr.request_id)}")
        return True

    def grow(self, vr: Any, num_new: int) -> bool:
        """Slots for a running request: on a refusal preempt the newest and
        try again, until it fits or ``vr`` itself was preempted."""
        while not self.allocate(vr, num_new):
            victim = list(self.live.values())[-1]
            self.preempt(victim)
            if victim is vr:
                return False
        return True

    def preempt(self, vr: Any) -> None:
        del self.live[vr.request_id]
        self.vm.free(vr)
        self.co.free(vr.request_id)
        vr.num_computed_tokens = 0
        vr.num_preemptions += 1
        self.waiting.append(vr)
        self.stats.bump("preempted")

    # ------------------------------------------------------------ operations

    def new_request(self) -> Any:
        rng, hbs = self.rng, self.cfg.hash_block_size
        tokens = list(rng.choice(self.docs)) if rng.random() < 0.85 else []
        if tokens and rng.random() < 0.5:
            tokens = tokens[: rng.randint(1, len(tokens))]
        tokens += [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3 * hbs))]
        tokens = tokens[: self.cfg.max_model_len - 8] or [1]
        rid = f"r{self.next_id}"
        self.next_id += 1
        return VRequest(
            rid, tokens, SamplingParams(max_tokens=1 << 20), None, None,
            block_hasher=self.hasher,
        )  # fmt: skip

    def admit(self, vr: Any | None = None) -> None:
        """Look the prefix up, then allocate the prompt (or a first chunk)."""
        if vr is None:
            vr = self.new_request()
        vhit, n = self.vm.get_computed_blocks(vr)
        ohit, on = self.co.find_longest_cache_hit(vr.block_hashes, vr.num_tokens - 1)
        if n != on:
            self.fail(f"{vr.request_id}: hit tokens vllm {n} ours {on}")
        vids = [[b.block_id for b in g] for g in vhit.blocks]
        oids = [[b.block_id for b in g] for g in ohit]
        if vids != oids:
            self.fail(f"{vr.request_id}: hit blocks vllm {vids} ours {oids}")
        rest = vr.num_tokens - n
        chunk = rest if self.rng.random() < 0.6 else self.rng.randint(1, rest)
        if not self.allocate(vr, chunk, n, vhit, ohit):
            # vLLM's scheduler would leave it waiting; free the newest as well
            self.waiting.append(vr)
            if self.live:
                self.preempt(list(self.live.values())[-1])
            return
        self.live[vr.request_id] = vr
        vr.num_computed_tokens = n + chunk
        self.stats.hits += n
        self.stats.bump("admit" if chunk == rest else "admit a first chunk")

    def prefill_chunk(self, vr: Any) -> None:
        rest = vr.num_tokens - vr.num_computed_tokens
        chunk = rest if self.rng.random() < 0.5 else self.rng.randint(1, rest)
        if self.grow(vr, chunk):
            vr.num_computed_tokens += chunk
            self.stats.bump("prefill a chunk")

    def decode(self, vr: Any) -> None:
        k = self.rng.choice([1, 1, 1, 1, 2, 5])
        k = min(k, self.cfg.max_model_len - vr.num_tokens)
        if k <= 0:
            self.finish(vr)
            return
        vr.append_output_token_ids([self.rng.randrange(VOCAB) for _ in range(k)])
        if self.grow(vr, k):
            vr.num_computed_tokens += k
            self.stats.bump("decode")

    def step(self) -> None:
        """A request admitted in part gets its next chunk, else one decodes."""
        vr = self.rng.choice(list(self.live.values()))
        if vr.num_computed_tokens < vr.num_tokens:
            self.prefill_chunk(vr)
        else:
            self.decode(vr)

    def readmit(self) -> None:
        vr = self.waiting.pop(0)
        self.stats.bump("re-admit")
        self.admit(vr)

    def remove_skipped(self) -> None:
        vr = self.rng.choice(list(self.live.values()))
        self.vm.remove_skipped_blocks(vr.request_id, vr.num_computed_tokens)
        self.co.remove_skipped_blocks(vr.request_id, vr.num_computed_tokens)
        self.stats.bump("remove_skipped_blocks")

    def finish(self, vr: Any) -> None:
        del self.live[vr.request_id]
        self.vm.free(vr)
        self.co.free(vr.request_id)
        self.stats.bump("finish")

    def reset(self) -> None:
        if self.vm.reset_prefix_cache() is not self.pool.reset_prefix_cache():
            self.fail("reset_prefix_cache differs")
        self.stats.bump("reset")

    def run(self, ops: int) -> RunStats:
        rng = self.rng
        for _ in range(ops):
            busy = bool(self.live)
            self.perform(
                rng.random(),
                [
                    (0.25 if busy else 1.0, "admit", self.admit),
                    (0.33 if self.waiting else 0.0, "re-admit", self.readmit),
                    (0.8, "step", self.step),
                    (0.83, "remove_skipped_blocks", self.remove_skipped),
                    (0.995, "finish", lambda: self.finish(rng.choice(list(self.live.values())))),
                    (1.0, "reset", self.reset),
                ],
            )
            self.compare()
            self.stats.ops += 1
        return self.stats
