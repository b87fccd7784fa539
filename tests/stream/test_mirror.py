"""PoolMirror applies frames exactly as docs/protocol.md says."""

from __future__ import annotations

import numpy as np
import pytest

from app.stream import protocol as p
from app.stream.mirror import Gap, PoolMirror

N = 6


def snapshot(seq: int, **over: np.ndarray) -> p.Frame:
    cols = {
        "state": ("u8", over.get("state", np.array([0, 3, 3, 3, 3, 3], dtype=np.uint8))),
        "ref_cnt": ("i32", np.zeros(N, dtype=np.int32)),
        "hashed": ("u8", np.zeros(N, dtype=np.uint8)),
        "hash64": ("u64", np.zeros(N, dtype=np.uint64)),
        "group": ("u32", np.zeros(N, dtype=np.uint32)),
        "stamp": ("f64", over.get("stamp", np.arange(N, dtype=np.float64))),
    }
    return p.decode(
        p.encode(p.SNAPSHOT, seq, {"as_of": seq, "series": [], "recent_events": []}, cols)
    )


def delta(
    seq: int,
    ids: list[int],
    state: list[int],
    ref: list[int],
    hashed: list[int],
    h64: list[int],
    stamp: list[float],
    events: list[list[object]] | None = None,
) -> p.Frame:
    n = len(ids)
    cols = {
        "ids": ("u32", np.array(ids, dtype=np.uint32)),
        "state": ("u8", np.array(state, dtype=np.uint8)),
        "ref_cnt": ("i32", np.array(ref, dtype=np.int32)),
        "hashed": ("u8", np.array(hashed, dtype=np.uint8)),
        "hash64": ("u64", np.array(h64, dtype=np.uint64)),
        "group": ("u32", np.zeros(n, dtype=np.uint32)),
        "stamp": ("f64", np.array(stamp, dtype=np.float64)),
    }
    return p.decode(p.encode(p.DELTA, seq, {"events": events or [], "point": {"usage": 0.5}}, cols))


def config(epoch: str) -> p.Frame:
    return p.decode(p.encode(p.CONFIG, 0, {"epoch": epoch, "config": {"num_blocks": N}}))


def test_snapshot_then_deltas_give_state_queue_order_and_map() -> None:
    m = PoolMirror()
    m.apply(config("e1"))
    m.apply(snapshot(10))
    assert m.queue_order() == [1, 2, 3, 4, 5]
    # allocate 1, 2; cache both under two hashes; free 2 then 1 (stamps 6, 7)
    m.apply(delta(11, [1, 2], [1, 1], [1, 1], [1, 1], [0xAA, 0xBB], [1, 2]))
    assert m.queue_order() == [3, 4, 5] and m.counts()["in_use"] == 2
    m.apply(delta(12, [1, 2], [2, 2], [0, 0], [1, 1], [0xAA, 0xBB], [7, 6]))
    assert m.queue_order() == [3, 4, 5, 2, 1]
    assert m.hash_map() == {(0xAA, 0): [1], (0xBB, 0): [2]}
    assert m.counts() == {"null": 1, "in_use": 0, "cached": 2, "empty": 3}
    assert m.seq == 12 and m.deltas == 2 and m.points[-1] == {"usage": 0.5}


def test_gap_is_detected_and_nothing_is_applied() -> None:
    m = PoolMirror()
    m.apply(snapshot(5))
    with pytest.raises(Gap) as info:
        m.apply(delta(7, [1], [1], [1], [0], [0], [1]))
    assert (info.value.expected, info.value.got) == (6, 7)
    assert m.seq == 5 and m.state[1] == 3


def test_overlap_after_resume_is_ignored_and_deltas_before_snapshot_too() -> None:
    m = PoolMirror()
    m.apply(delta(3, [1], [1], [1], [0], [0], [1]))  # no snapshot yet
    assert m.seq is None and m.deltas == 0
    m.apply(snapshot(5))
    m.apply(delta(5, [1], [1], [1], [0], [0], [1]))  # already covered by the snapshot
    assert m.state[1] == 3 and m.seq == 5


def test_a_new_epoch_forgets_the_state_until_its_snapshot() -> None:
    m = PoolMirror()
    m.apply(config("e1"))
    m.apply(snapshot(50))
    m.apply(config("e2"))
    assert m.seq is None
    m.apply(delta(51, [1], [1], [1], [0], [0], [1]))
    assert m.deltas == 0
    m.apply(snapshot(2))
    assert m.seq == 2 and m.epoch == "e2"


def test_events_accumulate_in_order() -> None:
    m = PoolMirror()
    m.apply(snapshot(1))
    m.apply(delta(2, [], [], [], [], [], [], [[10, 0, ["aa"], None, 4, 4, None]]))
    m.apply(delta(3, [], [], [], [], [], [], [[11, 1, ["aa"]], [12, 2]]))
    assert [e[0] for e in m.events] == [10, 11, 12]
