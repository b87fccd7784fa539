"""The request level: vLLM 0.16.0's KVCacheManager against our
RequestManager (full attention), with the same prompts (shared documents,
LoRA, cache salt), admissions, decodes, preemptions and frees.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import torch
from vllm.lora.request import LoRARequest as VLoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils as vllm_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager as VKVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request as VRequest

import blockpool as bp

from .common import Run, RunStats

VOCAB = 1000


@dataclass(frozen=True)
class ManagerConfig:
    name: str
    num_blocks: int
    block_size: int
    groups: int = 1


# One group: vLLM puts identical full-attention layers in one group, and its
# hybrid coordinator wants different attention types (multi-group lookups are
# compared at the pool level, pool016).
MANAGER_CONFIGS = [
    ManagerConfig("manager, one group", 300, 16),
    ManagerConfig("manager, small blocks", 120, 4),
    ManagerConfig("manager, tiny pool", 40, 8),
]


def same_hashing() -> None:
    """Both sides hash with sha256 from the same NONE_HASH, and their events
    carry 64-bit integer hashes."""
    bp.init_none_hash(bp.sha256, seed="0")
    vllm_utils.init_none_hash(vllm_hashing.sha256)
    os.environ["VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"] = "1"
    bp.set_int_block_hashes(True)


class ManagerDriver(Run):
    """Our RequestManager against vLLM's KVCacheManager (full attention):
    admit = get_computed_blocks + allocate_slots, decode = append + allocate
    the new token's slot, finish = free."""

    def __init__(self, cfg: ManagerConfig, seed: int) -> None:
        super().__init__(cfg.name, seed)
        self.cfg = cfg
        self.rng = random.Random(seed * 7919 + cfg.num_blocks)
        same_hashing()
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

    def compare(self) -> None:
        v, o = self.vm.block_pool, self.opool
        self.same_pool_state(v, o)
        self.stats.events += self.same_taken_events(v, o)
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

    def reset(self) -> None:
        while self.vreqs:
            self.finish(next(iter(self.vreqs)))
        if self.vm.reset_prefix_cache() is not self.opool.reset_prefix_cache():
            self.fail("reset_prefix_cache differs")

    def run(self, ops: int) -> RunStats:
        rng = self.rng
        for _ in range(ops):
            self.perform(
                rng.random(),
                [
                    (0.35 if self.vreqs else 1.0, "admit", self.admit),
                    (0.8, "decode", self.decode),
                    (0.99, "finish", lambda: self.finish(rng.choice(list(self.vreqs)))),
                    (1.0, "reset", self.reset),
                ],
            )
            self.compare()
            self.stats.ops += 1
        vstats = self.vm.make_prefix_cache_stats()
        self.stats.bump("vllm queries (incl. refused)", vstats.queries if vstats else 0)
        return self.stats
