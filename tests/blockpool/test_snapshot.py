"""capture_pool / restore_pool: a pool and its manager at one moment, and back."""

from __future__ import annotations

import json
import random

import pytest

from blockpool import (
    BlockPool,
    KVCacheMetricsCollector,
    NotEnoughBlocksError,
    RequestManager,
    check_invariants,
)
from blockpool.core.invariants import check_coordinator
from blockpool.core.snapshot import (
    PoolSnapshot,
    SnapshotMismatch,
    capture_pool,
    pool_digest,
    restore_pool,
    snapshot_from_json,
    snapshot_to_json,
)


def make(n: int = 40, rng: random.Random | None = None) -> tuple[BlockPool, RequestManager]:
    rng = rng or random.Random(3)
    mc = KVCacheMetricsCollector(sample_rate=0.5, rng=rng.random)
    pool = BlockPool(
        n, enable_caching=True, hash_block_size=4, enable_kv_cache_events=True,
        metrics_collector=mc,
    )  # fmt: skip
    return pool, RequestManager(pool, 4, group_ids=(0, 1))


def workload(mgr: RequestManager, rng: random.Random, steps: int, tag: str) -> list[object]:
    """Admit, decode and finish requests sharing prefixes; returns what happened."""
    log: list[object] = []
    for i in range(steps):
        running = list(mgr.requests)
        if running and rng.random() < 0.45:
            rid = rng.choice(running)
            if rng.random() < 0.5:
                try:
                    log.append(("append", rid, mgr.append_tokens(rid, [rng.randrange(50)] * 3)))
                except NotEnoughBlocksError:
                    log.append(("append-refused", rid))
            else:
                log.append(("finish", rid, mgr.finish(rid)))
            continue
        prefix = [rng.randrange(3)] * 8
        tokens = prefix + [rng.randrange(100) for _ in range(rng.randrange(1, 14))]
        try:
            adm = mgr.admit(f"{tag}{i}", tokens)
            log.append(("admit", adm.block_ids, adm.num_hit_blocks))
        except NotEnoughBlocksError:
            log.append(("refused", i))
    log.append(("events", mgr.pool.take_events()))
    return log


def worked(
    seed: int, steps: int, rng: random.Random | None = None
) -> tuple[BlockPool, RequestManager, PoolSnapshot]:
    """A pool after ``steps`` seeded operations, its events taken, and its snapshot."""
    pool, mgr = make(rng=rng)
    workload(mgr, random.Random(seed), steps, "a")
    pool.take_events()
    return pool, mgr, capture_pool(pool, mgr)


def test_restore_reproduces_every_later_operation() -> None:
    sampling = random.Random(3)
    pool, mgr, snap = worked(1, 60, sampling)
    sampling_state = sampling.getstate()  # (the sampler's state is its owner's to keep)
    before = pool_digest(pool, mgr)
    # the original goes on ...
    later = workload(mgr, random.Random(2), 80, "b")
    after = pool_digest(pool, mgr)
    # ... and a fresh pool restored from the snapshot does exactly the same
    sampling2 = random.Random()
    sampling2.setstate(sampling_state)
    pool2, mgr2 = make(rng=sampling2)
    restore_pool(snap, pool2, mgr2)
    assert pool_digest(pool2, mgr2) == before
    assert workload(mgr2, random.Random(2), 80, "b") == later
    assert pool_digest(pool2, mgr2) == after
    check_invariants(pool)
    check_invariants(pool2)
    check_coordinator(mgr.coordinator)
    check_coordinator(mgr2.coordinator)


def test_restore_into_the_same_pool_rolls_back() -> None:
    pool, mgr, snap = worked(5, 50)
    before = pool_digest(pool, mgr)
    workload(mgr, random.Random(6), 50, "b")
    assert pool_digest(pool, mgr) != before
    restore_pool(snap, pool, mgr)
    assert pool_digest(pool, mgr) == before
    assert pool.take_events() == []  # queued events went with the rollback
    # the coordinator's tables went back too: the running requests' own lists
    co = mgr.coordinator
    assert {rid for g in co.groups for rid in g.tables} == set(mgr.requests)
    for rid, managed in mgr.requests.items():
        assert all(a is b for a, b in zip(co.tables_of(rid), managed.block_tables, strict=True))
    check_coordinator(co)
    workload(mgr, random.Random(8), 40, "c")  # and it runs on from there
    check_coordinator(co)


def test_json_round_trip_is_exact() -> None:
    pool, mgr, snap = worked(9, 70)
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    pool2, mgr2 = make()
    restore_pool(back, pool2, mgr2)
    assert pool_digest(pool2, mgr2) == pool_digest(pool, mgr)
    check_invariants(pool2)


def test_a_snapshot_that_does_not_fit_changes_nothing() -> None:
    pool, mgr = make(40)
    workload(mgr, random.Random(4), 30, "a")
    snap = capture_pool(pool, mgr)
    small, small_mgr = make(20)
    workload(small_mgr, random.Random(7), 10, "s")
    before = pool_digest(small, small_mgr)
    with pytest.raises(SnapshotMismatch, match="40 blocks, pool of 20"):
        restore_pool(snap, small, small_mgr)
    other_pool, _ = make(40)
    with pytest.raises(SnapshotMismatch, match="another pool"):
        restore_pool(snap, other_pool, small_mgr)
    assert pool_digest(small, small_mgr) == before
    check_invariants(small)
    check_invariants(other_pool)
