"""PoolReplica applies frames exactly as docs/protocol.md says."""

from __future__ import annotations

import numpy as np
import pytest

from app.stream import protocol as p
from app.stream.replica import FrameGap, PoolReplica

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
    header = {
        "epoch": epoch,
        "config": {"num_blocks": N},
        "block_columns": [list(c) for c in p.BLOCK_COLUMNS],
    }
    return p.decode(p.encode(p.CONFIG, 0, header))


def test_snapshot_then_deltas_give_state_queue_order_and_map() -> None:
    m = PoolReplica()
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
    m = PoolReplica()
    m.apply(snapshot(5))
    with pytest.raises(FrameGap) as info:
        m.apply(delta(7, [1], [1], [1], [0], [0], [1]))
    assert (info.value.expected, info.value.got) == (6, 7)
    assert m.seq == 5 and m.state[1] == 3


def test_overlap_after_resume_is_ignored_and_deltas_before_snapshot_too() -> None:
    m = PoolReplica()
    m.apply(delta(3, [1], [1], [1], [0], [0], [1]))  # no snapshot yet
    assert m.seq is None and m.deltas == 0
    m.apply(snapshot(5))
    m.apply(delta(5, [1], [1], [1], [0], [0], [1]))  # already covered by the snapshot
    assert m.state[1] == 3 and m.seq == 5


def test_a_new_epoch_forgets_the_state_until_its_snapshot() -> None:
    m = PoolReplica()
    m.apply(config("e1"))
    m.apply(snapshot(50))
    m.apply(config("e2"))
    assert m.seq is None
    m.apply(delta(51, [1], [1], [1], [0], [0], [1]))
    assert m.deltas == 0
    m.apply(snapshot(2))
    assert m.seq == 2 and m.epoch == "e2"


def test_events_accumulate_in_order() -> None:
    m = PoolReplica()
    m.apply(snapshot(1))
    m.apply(delta(2, [], [], [], [], [], [], [[10, 0, ["aa"], None, 4, 4, None]]))
    m.apply(delta(3, [], [], [], [], [], [], [[11, 1, ["aa"]], [12, 2]]))
    assert [e[0] for e in m.events] == [10, 11, 12]


def test_the_config_frame_declares_the_block_columns_frames_carry() -> None:
    """What the config frame's ``block_columns`` names is what a snapshot and
    a delta carry (names, dtypes, order), and what the replica keeps."""
    from app.pool.engine import Engine
    from app.pool.schemas import AdmitOp
    from app.shared.settings import Settings
    from app.stream.hub import StreamHub

    engine = Engine(Settings(num_blocks=32, block_size=4, hash_fn="sha256", hash_seed="0"))
    hub = StreamHub(engine)
    cfg = p.decode(hub.config_frame())
    declared = cfg.header["block_columns"]
    assert [name for name, _ in declared] == [
        "state", "ref_cnt", "hashed", "hash64", "group", "stamp",
    ]  # fmt: skip
    engine.tick()
    snap = p.decode(hub.snapshot_frame())
    assert [[n, d] for n, d, _, _ in snap.header["columns"]] == declared
    engine.apply(AdmitOp(request_id="A", token_ids=list(range(10))))
    engine.tick()
    dl = p.decode(hub.ring.frames[-1].full)
    assert [[n, d] for n, d, _, _ in dl.header["columns"]] == [["ids", "u32"], *declared]
    m = PoolReplica()
    for frame in (cfg, snap, dl):
        m.apply(frame)
    cols = engine.columns
    for name, _ in declared:
        assert np.array_equal(getattr(m, name), getattr(cols, name)), name
    assert m.counts() == cols.summary() == dl.header["blocks"]
    assert m.counts()["in_use"] == 3  # 10 tokens in blocks of 4
    assert dl.header["num_free_blocks"] == engine.pool.get_num_free_blocks() == 28
    assert dl.header["prefix_cache"]["queries_tokens"] == engine.manager.stats.queries
    engine.runtime.check()


def test_a_config_frame_without_a_declared_column_is_refused_by_the_replica() -> None:
    m = PoolReplica()
    cfg = config("e1")
    cfg.header["block_columns"] = [*cfg.header["block_columns"], ["extra", "u8"]]
    m.apply(cfg)
    with pytest.raises(p.FrameError, match="extra"):
        m.apply(snapshot(10))
    assert m.seq is None and len(m.state) == 0  # nothing applied
