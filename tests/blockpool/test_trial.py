"""All-or-nothing batches (blockpool/runtime/trial.py): the dry run's spare
is kept in step by replaying what the real runtime applied since, not by
copying the whole state each time; whatever the mix of single operations,
batches and refusals, a batch gives what the same operations one by one
give, and a refused batch changes nothing.  The runtimes run paranoid: each
dry run also asserts its spare equals the real runtime's state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from blockpool.core.snapshot import pool_digest
from blockpool.runtime import trial
from blockpool.runtime.config import RuntimeConfig
from blockpool.runtime.errors import OperationError
from blockpool.runtime.ops import AdmitOp, AllocateOp, AppendOp, FinishOp, FreeOp, PrefixLookupOp
from blockpool.runtime.runtime import PoolRuntime
from blockpool.runtime.state import digest, restore, snapshot
from blockpool.runtime.trial import BatchRefused, apply_all

CONFIG = RuntimeConfig(num_blocks=48, block_size=4)


def runtime() -> PoolRuntime:
    rt = PoolRuntime(CONFIG)
    rt.paranoid = True
    return rt


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the spare's whole copies (keyframe restores) the dry runs make."""
    made: list[int] = []
    real = trial.restore

    def counted(rt: PoolRuntime, kf: Any, *, check: bool = True) -> None:
        made.append(kf.pool.num_blocks)
        real(rt, kf, check=check)

    monkeypatch.setattr(trial, "restore", counted)
    return made


class Workload:
    """Seeded operations that succeed on the runtime they are made for:
    admissions sharing prefixes (hits, evictions), decode, finishes."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [[self.rng.randrange(50) for _ in range(8)] for _ in range(4)]
        self.running: list[str] = []
        self.n = 0

    def op(self, rt: PoolRuntime) -> Any:
        rng = self.rng
        free = rt.pool.get_num_free_blocks()
        if self.running and (free < 12 or rng.random() < 0.35):
            return FinishOp(request_id=self.running.pop(rng.randrange(len(self.running))))
        if self.running and rng.random() < 0.3:
            rid = rng.choice(self.running)
            return AppendOp(request_id=rid, token_ids=[rng.randrange(50) for _ in range(3)])
        if rng.random() < 0.1:
            return PrefixLookupOp(token_ids=rng.choice(self.prefixes))
        self.n += 1
        rid = f"r{self.n}"
        self.running.append(rid)
        tail = [rng.randrange(50) for _ in range(rng.randint(1, 9))]
        return AdmitOp(request_id=rid, token_ids=rng.choice(self.prefixes) + tail)


def test_batches_among_single_ops_match_one_by_one_with_one_whole_copy(copies: list[int]) -> None:
    rt, ref = runtime(), runtime()
    w = Workload(1)
    batches = 0
    for step in range(300):
        if step % 3 == 0:  # a batch of 2-5 operations, made as they would apply
            ops = []
            for _ in range(random.Random(step).randint(2, 5)):
                op = w.op(ref)
                ops.append(op)
                ref.apply(op)
            got = apply_all(rt, ops, rt.apply)
            assert len(got) == len(ops)
            batches += 1
        else:
            op = w.op(ref)
            assert rt.apply(op) == ref.apply(op)
    assert batches == 100
    assert copies == [48]  # the first dry run copies; the others replay the journal
    assert digest(rt) == digest(ref)
    rt.check()
    ref.check()


def test_a_refused_batch_changes_nothing_then_the_spare_is_copied_again(
    copies: list[int],
) -> None:
    rt = runtime()
    held = rt.apply(AllocateOp(num_blocks=2))["block_ids"]
    apply_all(rt, [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)], rt.apply)
    assert copies == [48]
    before = digest(rt)
    ops = [FreeOp(block_ids=held), AllocateOp(num_blocks=3), FreeOp(block_ids=[held[0]])]
    with pytest.raises(BatchRefused) as refused:
        apply_all(rt, ops, rt.apply)
    assert refused.value.index == 2 and isinstance(refused.value.error, OperationError)
    assert "already free" in refused.value.error.message
    assert digest(rt) == before  # nothing of ops 0 and 1 happened
    # the spare took the refused batch's first ops: it is copied whole next time
    got = apply_all(rt, [FreeOp(block_ids=held), AllocateOp(num_blocks=1)], rt.apply)
    assert copies == [48, 48]
    assert got[1]["block_ids"] == [5]  # blocks 1, 2 freed to the tail; 3, 4 held
    rt.check()


def test_a_journal_past_its_cap_is_dropped_for_a_whole_copy(copies: list[int]) -> None:
    rt = runtime()
    apply_all(rt, [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)], rt.apply)
    w = Workload(2)
    for _ in range(rt._journal_cap):
        rt.apply(w.op(rt))
    apply_all(rt, [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)], rt.apply)
    assert copies == [48]  # the cap's worth of operations is replayed
    for _ in range(3 * rt._journal_cap):  # (lookups are not journaled)
        if rt._journal is None:  # past the cap: journaling stopped
            break
        rt.apply(w.op(rt))
    assert rt._journal is None
    apply_all(rt, [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)], rt.apply)
    assert copies == [48, 48]
    rt.check()


def test_restoring_the_runtime_puts_its_spare_out_of_step(copies: list[int]) -> None:
    rt = runtime()
    kf = snapshot(rt, 0, 0.0)
    apply_all(rt, [AllocateOp(num_blocks=2), AllocateOp(num_blocks=2)], rt.apply)
    restore(rt, kf)  # back to the empty pool (e.g. a replica rebuilt)
    got = apply_all(rt, [AllocateOp(num_blocks=1), AllocateOp(num_blocks=1)], rt.apply)
    assert [g["block_ids"] for g in got] == [[1], [2]]
    assert len(copies) == 2
    rt.check()


def test_one_mutating_op_needs_no_dry_run(copies: list[int]) -> None:
    rt = runtime()
    before = pool_digest(rt.pool, rt.manager)
    with pytest.raises(BatchRefused) as refused:
        apply_all(rt, [PrefixLookupOp(token_ids=[1, 2, 3, 4]), FreeOp(block_ids=[3])], rt.apply)
    assert refused.value.index == 1 and copies == []
    assert pool_digest(rt.pool, rt.manager) == before
    assert rt.counters.ops_failed == 1  # the refusal is counted, as any
    rt.check()
