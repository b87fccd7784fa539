"""PoolRuntime on its own: every operation through ``execute``, what each
reports to the observer (its declared change kind, in the documented order),
the columns kept in step, a refusal that changes nothing, and the steps
around the handler: stamps, observer, columns, recorder, storage, wake-up."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.runtime import ChangeKind, PoolRuntime, RuntimeConfig, ops
from blockpool.runtime.errors import Conflict, NotEnoughBlocks, NotFound, ResetRefused, TooLarge
from blockpool.runtime.state import digest

# the observer method each kind of change calls (TOUCH calls none)
METHOD = {
    ChangeKind.ALLOCATE: "on_allocate",
    ChangeKind.FREE: "on_freed",
    ChangeKind.CACHE: "on_cache",
    ChangeKind.EVICT: "on_evict",
    ChangeKind.RESET: "on_reset",
    ChangeKind.ADMIT: "on_admit",
    ChangeKind.APPEND: "on_append",
    ChangeKind.FINISH: "on_finish",
}


class Told:
    """An observer that keeps what it was told, and the columns as it saw them."""

    def __init__(self, rt: PoolRuntime) -> None:
        self.rt = rt
        self.calls: list[tuple[str, Any]] = []

    def _keep(self, name: str, arg: Any) -> None:
        self.calls.append((name, arg))

    def on_allocate(self, ids: list[int]) -> None:
        # before the columns are re-read: the blocks still show their old state
        self._keep("on_allocate", (list(ids), [int(self.rt.columns.ref_cnt[i]) for i in ids]))

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:  # noqa: ARG002 the runtime observer's protocol
        self._keep("on_freed", first_stamp)

    def on_cache(self, hashes: Any) -> None:
        self._keep("on_cache", len(hashes))

    def on_evict(self, ids: list[int]) -> None:
        self._keep("on_evict", list(ids))

    def on_reset(self) -> None:
        self._keep("on_reset", None)

    def on_admit(self, rid: str, op: Any, adm: Any) -> None:
        self._keep("on_admit", (rid, list(op.token_ids), adm.block_ids))

    def on_append(self, rid: str, managed: Any, bt: int, bc: int, added: Any) -> None:  # noqa: ARG002 the runtime observer's protocol
        self._keep("on_append", (rid, bt, added))

    def on_finish(self, rid: str, managed: Any, first_stamp: int) -> None:  # noqa: ARG002 the runtime observer's protocol
        self._keep("on_finish", rid)


def make() -> tuple[PoolRuntime, Told]:
    rt = PoolRuntime(RuntimeConfig(num_blocks=10, block_size=4, max_ids_per_call=8))
    rt.paranoid = True
    told = Told(rt)
    rt.observe(told)
    return rt, told


def apply(rt: PoolRuntime, told: Told, op: ops.Op) -> tuple[dict[str, Any], list[str]]:
    before = len(told.calls)
    result = rt.apply(op)
    names = [n for n, _ in told.calls[before:]]
    kind = ops.SPEC_OF[type(op)].change
    assert names == ([] if kind is None or kind not in METHOD else [METHOD[kind]])
    return result, names


def test_every_operation_through_execute() -> None:
    rt, told = make()
    r, _ = apply(rt, told, ops.AllocateOp(num_blocks=3))
    assert r == {"block_ids": [1, 2, 3], "evicted": []}
    assert told.calls[-1] == ("on_allocate", ([1, 2, 3], [0, 0, 0]))  # seen before the re-read
    assert rt.columns.ref_cnt[1:4].tolist() == [1, 1, 1]
    r, _ = apply(rt, told, ops.TouchOp(block_ids=[2]))
    assert r == {"block_ids": [2], "ref_cnts": [2]}
    r, _ = apply(rt, told, ops.CacheOp(block_ids=[1, 2], token_ids=list(range(8))))
    hashes = r["block_hashes"]
    assert r["block_ids"] == [1, 2] and len(hashes) == 2
    r, _ = apply(rt, told, ops.LookupOp(block_hash=hashes[0]))
    assert r == {"hit": True, "group_ids": [0], "block_ids": [1]}
    r, _ = apply(rt, told, ops.PrefixLookupOp(token_ids=list(range(9))))
    assert r == {"num_tokens": 9, "num_hit_tokens": 8, "num_hit_blocks": 2}
    r, _ = apply(rt, told, ops.FreeOp(block_ids=[3, 2, 1, 2]))
    assert r == {"freed": [3, 2, 1, 2], "now_free": [3, 2, 1, 2]}
    assert [b.block_id for b in rt.pool.free_block_queue][-3:] == [3, 1, 2]
    assert rt.columns.queue_order().tolist()[-3:] == [3, 1, 2]
    r, _ = apply(rt, told, ops.AdmitOp(request_id="a", token_ids=list(range(10))))
    assert r["block_ids"] == [[1, 2, 4]] and r["num_hit_blocks"] == 2
    assert told.calls[-1] == ("on_admit", ("a", list(range(10)), [[1, 2, 4]]))
    r, _ = apply(rt, told, ops.AppendOp(request_id="a", token_ids=[1, 2, 3]))
    assert r == {"request_id": "a", "new_block_ids": [[5]], "num_tokens": 13}
    r, _ = apply(rt, told, ops.FinishOp(request_id="a"))
    assert r == {"request_id": "a", "freed_block_ids": [[5, 4, 2, 1]]}
    r, _ = apply(rt, told, ops.EvictOp(block_ids=[1, 9]))
    assert r == {"evicted": [1], "not_cached": [9]}
    r, _ = apply(rt, told, ops.ResetOp())
    assert r == {"reset": True} and not rt.columns.hashed.any()
    assert rt.counters.ops == 11 and rt.counters.ops_failed == 0
    rt.check()


@pytest.mark.parametrize(
    ("op", "error"),
    [
        (ops.AllocateOp(num_blocks=9), TooLarge),  # over max_ids_per_call
        (ops.AllocateOp(num_blocks=8), NotEnoughBlocks),  # 7 free after the setup
        (ops.FreeOp(block_ids=[2, 2]), Conflict),  # held once, freed twice
        (ops.TouchOp(block_ids=[0]), Conflict),  # the null block
        (ops.CacheOp(block_ids=[1], token_ids=[1, 2, 3, 4]), Conflict),  # a request's block
        (ops.AppendOp(request_id="nobody", token_ids=[1]), NotFound),
        (ops.FinishOp(request_id="nobody"), NotFound),
        (ops.AdmitOp(request_id="r", token_ids=[1]), Conflict),  # already running
        (ops.ResetOp(), ResetRefused),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_refusal_changes_nothing(op: ops.Op, error: type[Exception]) -> None:
    rt, told = make()
    rt.apply(ops.AdmitOp(request_id="r", token_ids=[7] * 5))
    rt.apply(ops.AllocateOp(num_blocks=1))
    before, calls = digest(rt), len(told.calls)
    stamp, dirty = rt.columns.next_stamp, rt.columns.take_dirty().tolist()
    with pytest.raises(error):
        rt.apply(op)
    assert digest(rt) == {**before, "counters": digest(rt)["counters"]}
    assert len(told.calls) == calls  # the observer heard nothing
    assert rt.columns.next_stamp == stamp and rt.columns.take_dirty().tolist() == []
    assert dirty  # (the setup's changes were taken)
    assert rt.counters.ops_failed == 1
    rt.check()


class Watching(Told):
    """Told, and what the pool, the columns and the counters showed when it was."""

    def __init__(self, rt: PoolRuntime) -> None:
        super().__init__(rt)
        self.seen: list[dict[str, Any]] = []

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:
        super().on_freed(first_stamp, now)
        cols, blocks = self.rt.columns, self.rt.pool.blocks
        self.seen.append(
            {
                "pool_ref": [blocks[i].ref_cnt for i in (1, 2, 3)],
                "col_ref": cols.ref_cnt[1:4].tolist(),
                "stamps": cols.stamp[1:4].tolist(),
                "next_stamp": cols.next_stamp,
            }
        )

    def on_allocate(self, ids: list[int]) -> None:
        super().on_allocate(ids)
        self.seen.append({"allocated": self.rt.counters.blocks_allocated})


def test_the_observer_is_told_after_the_stamps_before_the_columns_are_reread() -> None:
    rt = PoolRuntime(RuntimeConfig(num_blocks=10, block_size=4))
    rt.paranoid = True
    w = Watching(rt)
    rt.observe(w)
    rt.apply(ops.AllocateOp(num_blocks=3))
    assert w.seen[-1] == {"allocated": 0}  # step 3 before step 5
    assert rt.counters.blocks_allocated == 3
    first = rt.columns.next_stamp
    rt.apply(ops.FreeOp(block_ids=[3, 1, 2]))
    # step 1 done (the pool freed them), step 2 done (stamped in the order
    # freed), step 4 not yet (the columns still show the references)
    assert w.seen[-1] == {
        "pool_ref": [0, 0, 0],
        "col_ref": [1, 1, 1],
        "stamps": [first + 1, first + 2, first],
        "next_stamp": first + 3,
    }
    assert w.calls[-1] == ("on_freed", first)
    assert rt.columns.ref_cnt[1:4].tolist() == [0, 0, 0]  # step 4, after the observer
    assert rt.columns.queue_order().tolist()[-3:] == [3, 1, 2]
    rt.check()


class KeptRecord:
    """A recorder that keeps what ``execute`` hands it."""

    def __init__(self) -> None:
        self.due = False
        self.records: list[tuple[str, bool, Any, int, int]] = []
        self.keyframes = 0

    def record(self, op: Any, ok: bool, payload: Any, first_event: int, n_events: int) -> None:
        self.records.append((op.op, ok, payload, first_event, n_events))

    def keyframe(self) -> None:
        self.due = False
        self.keyframes += 1


def test_the_recorder_keeps_each_operation_with_its_own_events() -> None:
    rt = PoolRuntime(RuntimeConfig(num_blocks=6, block_size=4))
    rec = KeptRecord()
    rt.recorder = rec
    rt.apply(ops.AllocateOp(num_blocks=2))
    rt.apply(ops.CacheOp(block_ids=[1, 2], token_ids=list(range(8))))
    with pytest.raises(Conflict):
        rt.apply(ops.FreeOp(block_ids=[1, 1, 1]))
    rt.apply(ops.FreeOp(block_ids=[2, 1]))
    rt.apply(ops.AllocateOp(num_blocks=5))  # takes both cached blocks: two evictions
    assert [(name, ok) for name, ok, _, _, _ in rec.records] == [
        ("allocate", True),
        ("cache", True),
        ("free", False),
        ("free", True),
        ("allocate", True),
    ]
    assert rec.records[2][2]["code"] == "conflict"
    assert rec.records[4][2]["block_ids"] == [3, 4, 5, 2, 1]  # the cached ones last
    logged, _ = rt.events.since(0, 100)
    by_seq = {seq: type(ev).__name__ for seq, _, ev in logged}
    assert [[by_seq[s] for s in range(first, first + n)] for *_, first, n in rec.records] == [
        [],
        ["BlockStored"],
        [],
        [],
        ["BlockRemoved", "BlockRemoved"],  # each op's own events, found by seq
    ]
    assert rt.counters.events == {"BlockStored": 1, "BlockRemoved": 2, "AllBlocksCleared": 0}
    assert rt.counters.evictions == 2 and rt.counters.blocks_cached == 2
    assert rt.counters.ops == 5 and rt.counters.ops_failed == 1
    assert len(rt.tree) == 0  # both stored hashes were removed again
    rt.check()


def test_run_wakes_after_every_operation_and_keyframes_when_due() -> None:
    rt = PoolRuntime(RuntimeConfig(num_blocks=6, block_size=4))
    rec = KeptRecord()
    rt.recorder = rec
    woken: list[int] = []
    rt.after_op = lambda: woken.append(rt.counters.ops)
    rt.apply(ops.AllocateOp(num_blocks=1))
    rec.due = True
    with pytest.raises(NotFound):
        rt.apply(ops.FinishOp(request_id="nobody"))  # refused: still woken, still keyframed
    assert woken == [1, 2] and rec.keyframes == 1 and not rec.due
    rt.apply(ops.LookupOp(block_hash="00" * 32))
    assert woken == [1, 2, 3] and rec.keyframes == 1
    rt.check()


def test_new_request_ids_skip_the_ones_running() -> None:
    rt = PoolRuntime(RuntimeConfig(num_blocks=12, block_size=4))
    rt.apply(ops.AdmitOp(request_id="req-1", token_ids=[1, 2]))
    r = rt.apply(ops.AdmitOp(token_ids=[3, 4]))
    assert r["request_id"] == "req-2"
    assert sorted(rt.manager.requests) == ["req-1", "req-2"]
    rt.check()


class KeptWrites:
    """K/V storage that keeps what it was asked to write."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, int, int]] = []

    def write_request(self, managed: Any, start: int) -> None:
        self.writes.append((managed.request_id, start, managed.num_tokens))


def test_storage_writes_what_each_operation_computed() -> None:
    storage = KeptWrites()
    rt = PoolRuntime(RuntimeConfig(num_blocks=12, block_size=4), storage=storage)
    rt.apply(ops.AdmitOp(request_id="a", token_ids=list(range(9))))
    rt.apply(ops.AdmitOp(request_id="b", token_ids=list(range(10))))  # two blocks hit
    rt.apply(ops.AppendOp(request_id="a", token_ids=[5, 6]))
    rt.apply(ops.FinishOp(request_id="a"))  # nothing computed: nothing written
    assert storage.writes == [("a", 0, 9), ("b", 8, 10), ("a", 9, 11)]
    rt.check()


def test_each_refusal_has_its_stable_code() -> None:
    from blockpool.mirror.apply import Divergence
    from blockpool.runtime import errors

    kinds = [c for c in vars(errors).values() if isinstance(c, type)]
    codes = {c.__name__: c.code for c in kinds if issubclass(c, errors.OperationError)}
    assert codes == {
        "OperationError": "bad_request",
        "InvalidInput": "invalid_input",
        "NotFound": "not_found",
        "Conflict": "conflict",
        "NotEnoughBlocks": "not_enough_blocks",
        "ResetRefused": "reset_refused",
        "TooLarge": "too_large",
        "Unavailable": "unavailable",
    }
    assert Divergence.code == "mirror_divergence"  # a code of its own stays
    assert TooLarge("x", limit=3).as_dict() == {
        "code": "too_large",
        "message": "x",
        "details": {"limit": 3},
    }
