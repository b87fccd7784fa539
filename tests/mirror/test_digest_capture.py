"""The pool's digest kept in O(changes), and a snapshot copied over many steps.

``PoolDigest.update`` must equal ``pool_digest`` (from scratch) after any
pool calls; a ``Capture`` copied a slice at a time while the engine keeps
changing the pool must give exactly the pool of the moment it was started
(its digest, and a pool restored from it, equal the pool's then).
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blockpool.mirror import decode, encode
from blockpool.mirror.digest import PoolDigest, pool_digest
from blockpool.mirror.poolview import BadSnapshot, snapshot_digest, snapshot_of, to_pool_snapshot
from blockpool.mirror.protocol import Snapshot
from blockpool_vllm.capture import Capture
from tests.mirror.workload import FollowedEngine

ORDERS = ["append_all", "uncached_first"]


@pytest.mark.parametrize("free_order", ORDERS)
def test_the_incremental_digest_is_the_digest_after_every_step(free_order: str) -> None:
    engine = FollowedEngine(free_order=free_order)
    f = engine.follower
    values = set()
    for _ in range(150):
        engine.step()
        assert f.digest.value == pool_digest(engine.rt.pool)
        values.add(f.digest.value)
    assert len(values) > 100  # it does change with the pool
    assert all(b.digest is not None for b in engine.batches)  # on every batch
    engine.rt.check()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), order=st.sampled_from(ORDERS), n=st.integers(8, 80))
def test_the_incremental_digest_holds_for_any_workload(seed: int, order: str, n: int) -> None:
    engine = FollowedEngine(num_blocks=n, free_order=order)
    engine.rng = random.Random(seed)
    for _ in range(40):
        engine.step()
        assert engine.follower.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_the_digest_sees_what_a_wrong_mirror_would_get_wrong() -> None:
    engine = FollowedEngine(free_order="uncached_first")
    engine.drive(30)
    pool = engine.rt.pool
    d = PoolDigest(pool)
    base = d.value
    q = pool.free_block_queue
    # the queue's order: two free blocks swapped
    a = q.fake_free_list_head.next_free_block
    b = a.next_free_block
    assert a is not None and b is not None
    a.block_id, b.block_id = b.block_id, a.block_id
    assert pool_digest(pool) != base
    a.block_id, b.block_id = b.block_id, a.block_id
    # a ref count
    blk = next(x for x in pool.blocks[1:] if x.ref_cnt > 0)
    blk.ref_cnt += 1
    assert pool_digest(pool) != base
    blk.ref_cnt -= 1
    assert pool_digest(pool) == base
    engine.rt.check()


def _moment(engine: FollowedEngine) -> Snapshot:
    return snapshot_of(
        engine.rt.pool,
        engine.follower.op_count,
        engine.follower.seq,
        0.0,
        engine.stats(),
        digest=engine.follower.digest.value,
    )


@pytest.mark.parametrize("free_order", ORDERS)
@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_capture_copied_over_many_steps_is_the_pool_of_its_moment(
    free_order: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("blockpool_vllm.capture.SLICE", 8)
    monkeypatch.setattr("blockpool_vllm.follower.CAPTURE_BUDGET_S", 0.0)
    engine = FollowedEngine(num_blocks=96, free_order=free_order)
    engine.rng = random.Random(seed)
    f = engine.follower
    engine.drive(30)
    want = _moment(engine)
    want_ps, want_digest = to_pool_snapshot(want)
    assert want_digest == f.digest.value == pool_digest(engine.rt.pool)
    f.want_snapshot = True
    f.flush()  # nothing pending: the copy starts here, at this moment
    steps = 0
    while f.captured is None:  # a slice per step while the pool keeps changing
        assert f.capture is not None
        engine.step()
        steps += 1
        assert steps < 5_000
    assert steps > 3  # it did take several steps
    cap = f.captured
    snap = decode(encode(f.poll_snapshot() or pytest.fail("no snapshot")))
    assert isinstance(snap, Snapshot)
    assert cap is not None and (snap.ops, snap.seq) == (want.ops, want.seq)
    got_ps, got_digest = to_pool_snapshot(snap)
    assert got_digest == snap.digest == want_digest
    assert list(got_ps.queue) == list(want_ps.queue)
    assert list(got_ps.refs) == list(want_ps.refs)
    assert got_ps.keys == want_ps.keys
    assert got_ps.map_dicts == want_ps.map_dicts
    engine.rt.check()


def test_a_reset_abandons_a_capture_and_starts_again_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("blockpool_vllm.capture.SLICE", 8)
    monkeypatch.setattr("blockpool_vllm.follower.CAPTURE_BUDGET_S", 0.0)
    engine = FollowedEngine(num_blocks=64)
    f = engine.follower
    engine.drive(10)
    f.want_snapshot = True
    engine.follower.flush()
    assert f.capture is not None  # a slice of 8 blocks a step: not done yet
    # finish every request, then reset the prefix cache (a Reset op)
    from blockpool.runtime import ops

    for rid in list(engine.rt.manager.requests):
        engine.rt.apply(ops.FinishOp(request_id=rid))
    for bid in engine.raw:
        engine.rt.apply(ops.FreeOp(block_ids=[bid]))
    engine.raw.clear()
    engine.rt.apply(ops.ResetOp())
    assert f.capture is None and f.captures_abandoned == 1 and f.want_snapshot
    for _ in range(200):
        engine.step()
        if f.captured is not None:
            break
    snap = f.poll_snapshot()
    assert snap is not None and snap.ops > 0
    assert snapshot_digest(snap) == snap.digest
    engine.rt.check()


def test_the_senders_thread_copies_while_the_engine_steps_concurrently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine steps on one thread, another polls (and copies while the
    engine pauses): every snapshot it gets is consistent."""
    monkeypatch.setattr("blockpool_vllm.capture.SLICE", 16)
    monkeypatch.setattr("blockpool_vllm.follower.CAPTURE_BUDGET_S", 0.0)
    engine = FollowedEngine(num_blocks=256)
    engine.drive(20)
    stop = threading.Event()
    got: list[Snapshot] = []

    def poller() -> None:
        while not stop.is_set() and len(got) < 5:
            snap = engine.follower.poll_snapshot()
            if snap is not None:
                got.append(snap)
            time.sleep(0.001)

    t = threading.Thread(target=poller)
    t.start()
    try:
        deadline = time.monotonic() + 120
        while len(got) < 5 and time.monotonic() < deadline:
            for _ in range(5):
                engine.step()
            time.sleep(0.06)  # a pause: the other thread copies then
    finally:
        stop.set()
        t.join(30)
    assert len(got) == 5
    for snap in got:
        assert snapshot_digest(snap) == snap.digest
    engine.rt.check()


def test_a_snapshot_whose_parts_do_not_make_a_pool_is_refused() -> None:
    engine = FollowedEngine()
    engine.drive(20)
    snap = engine.follower.capture_now()
    import msgspec

    for change in (
        {"refs": snap.refs[:-4]},
        {"key_lens": snap.key_lens[:-1]},
        {"keys": snap.keys + b"x"},
        {"prev": b"\xff\xff\xff\xff" * snap.num_blocks},  # every block a head
    ):
        with pytest.raises(BadSnapshot):
            to_pool_snapshot(msgspec.structs.replace(snap, **change))
    assert to_pool_snapshot(snap)[1] == snap.digest
    engine.rt.check()


def test_a_capture_of_an_untouched_pool_is_all_free_blocks_in_order() -> None:
    engine = FollowedEngine(num_blocks=32)
    cap = Capture(engine.rt.pool, ops=0, seq=0, digest="", stats=(0, 0, 0), boot="b")
    cap.advance(float("inf"))
    assert cap.done
    ps, digest = to_pool_snapshot(cap.snapshot([]))
    assert list(ps.queue) == list(range(1, 32)) and digest == pool_digest(engine.rt.pool)
    engine.rt.check()


@pytest.mark.parametrize("free_order", ORDERS)
def test_the_digest_after_a_reset_amid_other_calls_of_the_same_step(free_order: str) -> None:
    from blockpool.runtime import ops

    engine = FollowedEngine(free_order=free_order)
    engine.drive(25)
    rt, f = engine.rt, engine.follower
    assert any(b.block_hash is not None for b in rt.pool.blocks)
    for rid in list(rt.manager.requests):  # in one step: every request finishes,
        rt.apply(ops.FinishOp(request_id=rid))
    for bid in engine.raw:
        rt.apply(ops.FreeOp(block_ids=[bid]))
    engine.raw.clear()
    rt.apply(ops.ResetOp())  # the cache is reset, and a new request comes in
    rt.apply(ops.AdmitOp(token_ids=list(range(3 * 4 + 1))))
    batch = f.flush()
    assert batch is not None and batch.digest is not None
    assert batch.digest.value == pool_digest(rt.pool)
    rt.check()
