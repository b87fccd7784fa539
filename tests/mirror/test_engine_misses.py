"""The engine's miss reasons in the library, without the service: a mirror's
runtime, its applier and ``EngineMisses`` observing the runtime's own
notifications; a ``skips_cache`` request's blocks are ``skipped``; a
restore announces the resync once."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.analysis.core import Analysis
from blockpool.analysis.engine_misses import EngineMisses, key0
from blockpool.common.miss_reasons import REASONS, SKIPPED
from blockpool.mirror import MirrorApplier, decode, encode
from blockpool.mirror.protocol import Arrive, Batch, Scheduled
from blockpool.runtime import PoolRuntime
from blockpool.runtime.observer import OpObserver
from blockpool.runtime.ops import AdmitOp, FinishOp
from tests.mirror.workload import FollowedEngine, config


def mirror(
    engine: FollowedEngine, *, inline: bool
) -> tuple[PoolRuntime, MirrorApplier, EngineMisses]:
    """A mirror's runtime: an inline analysis whose eviction ring the engine's
    misses share, or the engine's misses alone (their own ring)."""
    rt = PoolRuntime(config(engine.rt.pool.num_gpu_blocks, engine.free_order))
    rt.paranoid = True
    analysis = None
    if inline:
        analysis = Analysis(rt, miss_index_size=1 << 14, miss_finished_kept=16)
        rt.observe(analysis)
    misses = EngineMisses.observing(rt, analysis)
    applier = MirrorApplier(rt)
    applier.synced = True
    return rt, applier, misses


def follow(
    rt: PoolRuntime, applier: MirrorApplier, misses: EngineMisses, batches: list[Batch]
) -> dict[str, list[str | None]]:
    """As the service's writer does: the requests first scheduled in a step
    are classified against the pool as the step found it, then its
    operations are applied.  The reasons per request."""
    arrived: dict[str, Arrive] = {}
    out: dict[str, list[str | None]] = {}

    def step(b: Batch) -> None:
        applier.learn_requests(b.requests)
        for rec in b.requests:
            if isinstance(rec, Arrive):
                arrived[rec.rid] = rec
            elif isinstance(rec, Scheduled) and rec.rid in arrived:
                a = arrived.pop(rec.rid)
                out[rec.rid], _ = misses.classify(
                    a.hashes, a.prompt_tokens, rec.hit_tokens, skips_cache=a.skips_cache
                )
        applier.apply_batch(b)

    for b in batches:
        wired = decode(encode(b))
        assert isinstance(wired, Batch)
        rt.run(lambda wired=wired: step(wired))
    return out


@pytest.mark.parametrize("free_order", ["append_all", "uncached_first"])
def test_the_library_observer_gives_the_simulated_pools_reasons(free_order: str) -> None:
    engine = FollowedEngine(free_order=free_order)
    engine.tell_requests = True
    engine.admit_alone = True
    own = Analysis(engine.rt, miss_index_size=1 << 16, miss_finished_kept=1 << 12)
    engine.rt.observe(own)
    engine.drive(200)
    shared = mirror(engine, inline=True)
    alone = mirror(engine, inline=False)
    assert shared[2].ring is shared[0].observers[0].misses.ring  # type: ignore[attr-defined]
    assert not shared[2].records and alone[2].records and alone[0].observers == (alone[2],)
    got_shared = follow(*shared, engine.batches)
    got_alone = follow(*alone, engine.batches)
    assert got_shared == got_alone  # one eviction memory or the other: the same answers
    compared: dict[str, int] = {}
    for rid, reasons in got_alone.items():
        rm = own.misses.lookup(rid)
        assert rm is not None
        want = []
        for name, det in own.misses.block_reasons(rm):
            if name == "block_size_floor" and not (det or {}).get("partial"):
                name = "cold"  # the shared tokens: not told by hashes
            want.append(name)
        assert reasons == want, rid
        for name in want:
            compared[str(name)] = compared.get(str(name), 0) + 1
    assert {"cold", "evicted", "block_size_floor", "None"} <= set(compared), compared
    # the tally is MissTally's, and says what the requests were told
    for _, _, misses in (shared, alone):
        counted = dict.fromkeys(REASONS, 0)
        for reasons in got_alone.values():
            for r in reasons:
                if r is not None:
                    counted[r] += 1
        assert misses.tally.counts() == counted
        assert misses.section()["misses"] == counted
        assert misses.admissions == len(got_alone) > 20
        assert misses.view()["dropped_hashes_remembered"] > 0
    for rt, _, _ in (shared, alone):
        rt.check()
    engine.rt.check()


def test_a_request_that_skips_the_cache_is_skipped_not_evicted() -> None:
    """``Arrive.skips_cache`` (vLLM's ``prompt_logprobs``): the engine did not
    look the prompt up, so a cached prefix missing is no eviction and no
    broken chain."""
    engine = FollowedEngine()
    rt, applier, misses = mirror(engine, inline=False)
    prompt = engine.prefixes[0] + [1, 2]  # 3 full blocks, a partial tail
    rid = engine.rt.apply(AdmitOp(token_ids=prompt))["request_id"]
    chain = [bytes(h) for h in engine.rt.manager.requests[rid].block_hashes]
    engine.rt.apply(FinishOp(request_id=rid))
    engine.follower.flush()
    follow(rt, applier, misses, engine.batches)
    engine.batches.clear()
    assert len(chain) == 3 and all(
        rt.pool.cached_block_hash_to_block.get_one_block(key0(h)) is not None for h in chain
    )
    n = len(prompt)
    # the same prompt, told as skipping the cache: no hit, every full block skipped
    asked = Batch(seq=engine.follower.seq + 1, step=0, ts=0.0, first_op=applier.next_op, ops=[],
                  requests=[Arrive("lp", 1.0, n, chain, skips_cache=True), Scheduled("lp", 1.0, 0)],
                  stats=engine.stats(), drops=0)  # fmt: skip
    reasons = follow(rt, applier, misses, [asked])["lp"]
    assert reasons == ["skipped", "skipped", "skipped", "block_size_floor"]
    assert misses.blocks[SKIPPED] == 3 and misses.section()["misses"]["skipped"] == 3
    # without the flag, a miss of the cached chain says eviction in the step
    reasons_flagless, details = misses.classify(chain, n, 0)
    assert reasons_flagless == ["evicted", "chain_broken", "chain_broken", "block_size_floor"]
    assert details[0] == {"in_step": True}
    _, details = misses.classify(chain, n, 0, skips_cache=True)
    assert details[0] == {"cached": True} and details[3]["partial"]
    rt.check()
    engine.rt.check()


class Resyncs(OpObserver):
    def __init__(self) -> None:
        self.told: list[str] = []

    def on_allocate(self, ids: list[int]) -> None:  # noqa: ARG002 the observer protocol's signature
        self.told.append("allocate")

    def on_resync(self) -> None:
        self.told.append("resync")


def test_a_restore_announces_the_resync_once_to_every_observer() -> None:
    engine = FollowedEngine()
    engine.drive(30)
    rt, applier, misses = mirror(engine, inline=True)
    first, second = Resyncs(), Resyncs()
    rt.observe(first)
    rt.observe(second)
    assert len(rt.observers) == 3 and rt.observers[1:] == (first, second)
    engine.batches.clear()
    snap = engine.follower.capture_now()
    assert snap is not None
    rt.run(lambda: applier.restore(snap))
    assert first.told == second.told == ["resync"]
    assert applier.next_op == snap.ops and applier.synced
    # the resync is no operation: none counted, none recorded
    assert rt.counters.ops == 1 and rt.counters.blocks_allocated == 0
    engine.drive(10)
    follow(rt, applier, misses, engine.batches)
    assert first.told.count("resync") == 1 and "allocate" in first.told
    rt.check()
    engine.rt.check()


def test_the_applier_learns_chains_only_when_the_writer_runs_it() -> None:
    """The parents map changes through the writer's calls (``learn_requests``
    in a step, ``learn_chain`` from cache operations), never by reading a batch."""
    engine = FollowedEngine()
    engine.tell_requests = True
    engine.drive(5)
    rt, applier, _ = mirror(engine, inline=False)
    before = dict(applier.parents)
    arrivals: list[Any] = [r for b in engine.batches for r in b.requests if isinstance(r, Arrive)]
    assert arrivals and before == {}
    applier.learn_requests(arrivals)
    assert set(arrivals[0].hashes) <= set(applier.parents)
    rt.check()
