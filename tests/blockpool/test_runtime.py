"""PoolRuntime on its own: every operation through ``execute``, what each
reports to the observer (its declared change kind, in the documented order),
the columns kept in step, and a refusal that changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from blockpool.runtime import ChangeKind, PoolRuntime, RuntimeConfig
from blockpool.runtime.errors import Conflict, NotEnoughBlocks, NotFound, ResetRefused, TooLarge
from blockpool.runtime.ops import (
    SPEC_OF,
    AdmitOp,
    AllocateOp,
    AppendOp,
    CacheOp,
    EvictOp,
    FinishOp,
    FreeOp,
    LookupOp,
    Op,
    PrefixLookupOp,
    ResetOp,
    TouchOp,
)
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

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:
        self._keep("on_freed", first_stamp)

    def on_cache(self, hashes: Any) -> None:
        self._keep("on_cache", len(hashes))

    def on_evict(self, ids: list[int]) -> None:
        self._keep("on_evict", list(ids))

    def on_reset(self) -> None:
        self._keep("on_reset", None)

    def on_admit(self, rid: str, op: Any, adm: Any) -> None:
        self._keep("on_admit", (rid, list(op.token_ids), adm.block_ids))

    def on_append(self, rid: str, managed: Any, bt: int, bc: int, added: Any) -> None:
        self._keep("on_append", (rid, bt, added))

    def on_finish(self, rid: str, managed: Any, first_stamp: int) -> None:
        self._keep("on_finish", rid)


def make() -> tuple[PoolRuntime, Told]:
    rt = PoolRuntime(RuntimeConfig(num_blocks=10, block_size=4, max_ids_per_call=8))
    rt.paranoid = True
    told = Told(rt)
    rt.hooks = told
    return rt, told


def apply(rt: PoolRuntime, told: Told, op: Op) -> tuple[dict[str, Any], list[str]]:
    before = len(told.calls)
    result = rt.apply(op)
    names = [n for n, _ in told.calls[before:]]
    kind = SPEC_OF[type(op)].change
    assert names == ([] if kind is None or kind not in METHOD else [METHOD[kind]])
    return result, names


def test_every_operation_through_execute() -> None:
    rt, told = make()
    r, _ = apply(rt, told, AllocateOp(num_blocks=3))
    assert r == {"block_ids": [1, 2, 3], "evicted": []}
    assert told.calls[-1] == ("on_allocate", ([1, 2, 3], [0, 0, 0]))  # seen before the re-read
    assert rt.columns.ref_cnt[1:4].tolist() == [1, 1, 1]
    r, _ = apply(rt, told, TouchOp(block_ids=[2]))
    assert r == {"block_ids": [2], "ref_cnts": [2]}
    r, _ = apply(rt, told, CacheOp(block_ids=[1, 2], token_ids=list(range(8))))
    hashes = r["block_hashes"]
    assert r["block_ids"] == [1, 2] and len(hashes) == 2
    r, _ = apply(rt, told, LookupOp(block_hash=hashes[0]))
    assert r == {"hit": True, "group_ids": [0], "block_ids": [1]}
    r, _ = apply(rt, told, PrefixLookupOp(token_ids=list(range(9))))
    assert r == {"num_tokens": 9, "num_hit_tokens": 8, "num_hit_blocks": 2}
    r, _ = apply(rt, told, FreeOp(block_ids=[3, 2, 1, 2]))
    assert r == {"freed": [3, 2, 1, 2], "now_free": [3, 2, 1, 2]}
    assert [b.block_id for b in rt.pool.free_block_queue][-3:] == [3, 1, 2]
    assert rt.columns.queue_order().tolist()[-3:] == [3, 1, 2]
    r, _ = apply(rt, told, AdmitOp(request_id="a", token_ids=list(range(10))))
    assert r["block_ids"] == [[1, 2, 4]] and r["num_hit_blocks"] == 2
    assert told.calls[-1] == ("on_admit", ("a", list(range(10)), [[1, 2, 4]]))
    r, _ = apply(rt, told, AppendOp(request_id="a", token_ids=[1, 2, 3]))
    assert r == {"request_id": "a", "new_block_ids": [[5]], "num_tokens": 13}
    r, _ = apply(rt, told, FinishOp(request_id="a"))
    assert r == {"request_id": "a", "freed_block_ids": [[5, 4, 2, 1]]}
    r, _ = apply(rt, told, EvictOp(block_ids=[1, 9]))
    assert r == {"evicted": [1], "not_cached": [9]}
    r, _ = apply(rt, told, ResetOp())
    assert r == {"reset": True} and not rt.columns.hashed.any()
    assert rt.counters.ops == 11 and rt.counters.ops_failed == 0
    rt.check()


@pytest.mark.parametrize(
    ("op", "error"),
    [
        (AllocateOp(num_blocks=9), TooLarge),  # over max_ids_per_call
        (AllocateOp(num_blocks=8), NotEnoughBlocks),  # 7 free after the setup
        (FreeOp(block_ids=[2, 2]), Conflict),  # held once, freed twice
        (TouchOp(block_ids=[0]), Conflict),  # the null block
        (CacheOp(block_ids=[1], token_ids=[1, 2, 3, 4]), Conflict),  # a request's block
        (AppendOp(request_id="nobody", token_ids=[1]), NotFound),
        (FinishOp(request_id="nobody"), NotFound),
        (AdmitOp(request_id="r", token_ids=[1]), Conflict),  # already running
        (ResetOp(), ResetRefused),
    ],
    ids=lambda v: type(v).__name__,
)
def test_a_refusal_changes_nothing(op: Op, error: type[Exception]) -> None:
    rt, told = make()
    rt.apply(AdmitOp(request_id="r", token_ids=[7] * 5))
    rt.apply(AllocateOp(num_blocks=1))
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
