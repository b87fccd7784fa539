"""The engine's steps are not a REST client's: a mirror applies operations
larger than the caps the service puts on its clients (ids per call, tokens
per request), and those caps still hold for the clients."""

from __future__ import annotations

import dataclasses

import pytest

from blockpool.analysis.moments import apply_entry
from blockpool.mirror import MirrorApplier, pool_digest
from blockpool.mirror.protocol import Allocate, Batch
from blockpool.runtime import UNCAPPED, PoolRuntime, TooLarge
from blockpool.runtime.ops import AdmitOp, AllocateOp, FreeOp
from tests.mirror.workload import BLOCK, FollowedEngine, config

NUM_BLOCKS = 4096
PREFILL_BLOCKS = 512  # an 8k-token prefill at block size 16


def capped_mirror(engine: FollowedEngine) -> tuple[PoolRuntime, MirrorApplier]:
    """A mirror whose clients may name 64 ids per call and 1,024 tokens a request."""
    cfg = dataclasses.replace(
        config(NUM_BLOCKS, engine.free_order), max_ids_per_call=64, max_tokens_per_request=1024
    )
    rt = PoolRuntime(cfg)
    rt.paranoid = True
    applier = MirrorApplier(rt)
    applier.synced = True
    return rt, applier


def test_a_prefill_larger_than_the_rest_caps_applies() -> None:
    engine = FollowedEngine(num_blocks=NUM_BLOCKS)
    rt, applier = capped_mirror(engine)
    prompt = list(range(PREFILL_BLOCKS * BLOCK))
    got = engine.rt.apply(AdmitOp(token_ids=prompt))
    assert len(got["block_ids"][0]) == PREFILL_BLOCKS
    engine.follower.flush()
    engine.rt.apply(AllocateOp(num_blocks=200))  # a raw allocation of 200 ids at once
    engine.follower.flush()
    assert any(
        isinstance(op, Allocate) and len(op.ids) >= PREFILL_BLOCKS
        for b in engine.batches
        for op in b.ops
    )
    for b in engine.batches:
        rt.run(lambda b=b: applier.apply_batch(b))
    assert applier.next_op == engine.follower.op_count
    assert pool_digest(rt.pool) == pool_digest(engine.rt.pool)
    assert rt.counters.ops_failed == 0
    # a client of the mirror's runtime still meets the caps, before and after
    assert rt.caps == rt.config.caps and rt.caps.max_ids_per_call == 64
    with pytest.raises(TooLarge):
        rt.apply(AllocateOp(num_blocks=65))
    with pytest.raises(TooLarge):
        rt.apply(AdmitOp(token_ids=list(range(1025))))
    assert rt.counters.ops_failed == 2
    rt.check()
    engine.rt.check()


def test_an_uncapped_step_still_has_its_ranges_checked() -> None:
    engine = FollowedEngine(num_blocks=NUM_BLOCKS)
    rt, applier = capped_mirror(engine)
    bad = Batch(seq=1, step=1, ts=0.0, first_op=0, ops=[Allocate([NUM_BLOCKS + 5])], requests=[],
                stats=(0, 0, 0), drops=0)  # fmt: skip
    with pytest.raises(Exception, match="operation 0"):
        rt.run(lambda: applier.apply_batch(bad))
    # an id outside the pool is refused by the handler, uncapped or not
    with pytest.raises(Exception, match="outside the pool"):
        rt.apply(FreeOp(block_ids=[NUM_BLOCKS + 5]), UNCAPPED)
    assert rt.caps == rt.config.caps  # the caps are back after a refusal too
    rt.check()


def test_a_replay_applies_what_the_writer_accepted_uncapped() -> None:
    """A recording's replica (time travel, the analysis worker) replays an
    accepted operation whatever the caps; a refused one meets them again."""
    engine = FollowedEngine(num_blocks=NUM_BLOCKS)
    rt, _ = capped_mirror(engine)
    ok, result = apply_entry(rt, AllocateOp(num_blocks=100), True)
    assert ok and len(result["block_ids"]) == 100
    ok, error = apply_entry(rt, AllocateOp(num_blocks=100), False)
    assert not ok and error["code"] == TooLarge.code
    rt.check()
