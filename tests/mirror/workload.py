"""An engine for the mirror's tests: a blockpool runtime followed as vLLM's pool is.

``FollowedEngine`` is a PoolRuntime (the "engine") whose pool a
``PoolFollower`` wraps exactly as the plugin wraps vLLM's; ``drive`` puts a
seeded random workload through it (requests sharing prefixes, raw block
calls, evictions, resets) and flushes one batch per step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from blockpool.mirror.protocol import (
    PROTOCOL,
    Arrive,
    Batch,
    Finished,
    Group,
    Hello,
    Scheduled,
)
from blockpool.runtime import PoolRuntime, RuntimeConfig, ops
from blockpool.runtime.errors import OperationError
from blockpool_vllm.follower import PoolFollower

BLOCK = 4


def config(num_blocks: int = 64, free_order: str = "append_all") -> RuntimeConfig:
    return RuntimeConfig(
        num_blocks=num_blocks, block_size=BLOCK, hash_fn="sha256", free_order=free_order
    )


class FollowedEngine:
    def __init__(
        self,
        num_blocks: int = 64,
        free_order: str = "append_all",
        send: Callable[[Batch], bool] | None = None,
        defer_digest: bool = False,
        windowed: bool = False,
        pipelined: bool = False,
    ) -> None:
        self.rt = PoolRuntime(config(num_blocks, free_order))
        self.batches: list[Batch] = []
        self.accept = True  # False: the sender's queue is "full" (a drop)
        self.send = send  # a real sender's offer (None: batches kept in a list)
        st = self.rt.manager

        def offer(b: Batch) -> bool:
            if not self.accept:
                return False
            if self.send is not None:
                return self.send(b)
            # what the sender's thread does, here on the caller's: a test with a
            # thread of its own calling catch_up passes ``send`` and prepares there
            self.batches.append(self.follower.prepare(b))
            return True

        self.follower = PoolFollower(
            self.rt.pool,
            offer,
            digest_every=1,
            stats=lambda: (st.stats.requests, st.stats.queries, st.stats.hits),
            defer_digest=defer_digest,
            windowed=windowed,
            pipelined=pipelined,
        )
        self.rng = random.Random(7)
        self.prefixes = [[self.rng.randrange(1000) for _ in range(BLOCK * 3)] for _ in range(4)]
        self.raw: list[int] = []  # block ids held through the raw API
        self.free_order = free_order
        self.problems: list[str] = []  # what the handshake says it cannot follow
        self.tell_requests = False  # True: records of each request, as the plugin's
        self.model: str | None = None  # the handshake's model name
        self.admit_alone = False  # True: each admission is a step of its own

    def stats(self) -> tuple[int, int, int]:
        s = self.rt.manager.stats
        return (s.requests, s.queries, s.hits)

    def hello(self, control_port: int | None = None) -> Hello:
        return Hello(
            protocol=PROTOCOL,
            engine_id="test-engine",
            vllm_version="0.16.0" if self.free_order == "append_all" else "0.32.0",
            num_gpu_blocks=self.rt.pool.num_gpu_blocks,
            block_size=BLOCK,
            hash_block_size=BLOCK,
            hash_fn="sha256",
            groups=[Group(0, "FullAttentionSpec", BLOCK)],
            free_order=self.free_order,
            exact=not self.problems,
            problems=list(self.problems),
            digest_every=1,
            control_port=control_port,
            started_at=1.0,
            seq=self.follower.seq,
            model=self.model,
        )

    def _try(self, op: Any) -> Any:
        try:
            return self.rt.apply(op)
        except OperationError:
            return None

    def step(self) -> None:
        """One scheduler-like step: a few operations, then a flush."""
        rng, rt = self.rng, self.rt
        for _ in range(rng.randrange(1, 5)):
            r = rng.random()
            running = list(rt.manager.requests)
            if r < 0.35 or not running:
                prompt = rng.choice(self.prefixes) + [
                    rng.randrange(1000) for _ in range(rng.randrange(1, 3 * BLOCK))
                ]
                if self.admit_alone:
                    self.follower.flush()
                got = self._try(ops.AdmitOp(token_ids=prompt))
                if got and self.tell_requests:
                    self._told_admit(got["request_id"], len(prompt), got["num_hit_blocks"])
                if self.admit_alone:
                    self.follower.flush()
            elif r < 0.55:
                rid = rng.choice(running)
                self._try(ops.AppendOp(request_id=rid, token_ids=[rng.randrange(1000)] * BLOCK))
            elif r < 0.8:
                rid = rng.choice(running)
                n = rt.manager.requests[rid].num_tokens
                if self._try(ops.FinishOp(request_id=rid)) and self.tell_requests:
                    self.follower.request(Finished(rid, time.time(), n))
            elif r < 0.86:
                got = self._try(ops.AllocateOp(num_blocks=rng.randrange(1, 3)))
                if got:
                    self.raw.extend(got["block_ids"])
                    tokens = [rng.randrange(1000) for _ in range(BLOCK)]
                    self._try(ops.CacheOp(block_ids=got["block_ids"][:1], token_ids=tokens))
            elif r < 0.9 and self.raw:
                bid = self.raw.pop(rng.randrange(len(self.raw)))
                self._try(ops.FreeOp(block_ids=[bid]))
            elif r < 0.93:
                cached = [b.block_id for b in rt.pool.blocks if b.block_hash is not None]
                if cached:
                    bid = rng.choice(cached)
                    if self._try(ops.TouchOp(block_ids=[bid])):
                        self.raw.append(bid)
            elif r < 0.97:
                self._try(ops.EvictOp(block_ids=[rng.randrange(1, rt.pool.num_gpu_blocks)]))
            elif not running and not self.raw:
                self._try(ops.ResetOp())
        self.follower.flush()

    def _told_admit(self, rid: str, prompt_tokens: int, hit_blocks: int) -> None:
        """What the plugin publishes of a new request: its arrival (hashes and
        lengths), then its first scheduling (the prefix hit in tokens)."""
        hashes = [bytes(h) for h in self.rt.manager.requests[rid].block_hashes]
        now = time.time()
        self.follower.request(Arrive(rid, now, prompt_tokens, hashes))
        self.follower.request(Scheduled(rid, now, hit_blocks * BLOCK))

    def drive(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
        self.rt.check()


def passes_of(engine: FollowedEngine, lengths_ns: list[int]) -> None:
    """Forward passes this long (the engine's hooks, clocks moved back)."""
    p = engine.follower.passes
    for n in lengths_ns:
        p.begins()
        p.began -= n
        p.ends()
