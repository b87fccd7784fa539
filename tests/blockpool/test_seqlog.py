"""SeqLog: bounded by count, and (for KV events) by the tokens and hashes its
entries hold; drops are counted and readers told where the log now starts."""

from __future__ import annotations

import pytest

from blockpool import BlockRemoved, BlockStored
from blockpool.runtime import PoolRuntime, RuntimeConfig, SeqLog
from blockpool.runtime.ops import AdmitOp, FinishOp
from blockpool.runtime.runtime import event_weight


def test_count_bound_drops_the_oldest() -> None:
    log: SeqLog[str] = SeqLog(3)
    log.extend(1.0, "abcde")
    assert [(s, x) for s, _, x in log.since(0, 10)[0]] == [(3, "c"), (4, "d"), (5, "e")]
    assert (log.dropped, log.first_seq, log.last_seq) == (2, 3, 5)
    assert log.since(0, 10)[1] is True and log.since(2, 10)[1] is False


def test_weight_bound_keeps_the_newest_and_counts_the_rest() -> None:
    log: SeqLog[int] = SeqLog(100, max_weight=10, weigh=lambda n: n)
    log.extend(1.0, [4, 4])
    assert (len(log), log.weight, log.dropped) == (2, 8, 0)
    log.extend(2.0, [3])  # 11 > 10: the oldest goes
    assert [x for _, _, x in log.since(0, 10)[0]] == [4, 3]
    assert (log.weight, log.dropped, log.first_seq) == (7, 1, 2)
    log.extend(3.0, [50])  # one entry over the bound alone: it stays, the rest go
    assert [x for _, _, x in log.since(0, 10)[0]] == [50]
    assert (log.weight, log.dropped, log.last_seq) == (50, 3, 4)
    log.clear()
    assert (len(log), log.weight) == (0, 0)


def test_both_bounds_keep_the_weights_in_step() -> None:
    log: SeqLog[int] = SeqLog(3, max_weight=100, weigh=lambda n: n)
    # the count drops 10 then 20 (at 40 and 50); then 30+40+50 = 120 > 100 drops 30
    log.extend(1.0, [10, 20, 30, 40, 50])
    assert [x for _, _, x in log.since(0, 10)[0]] == [40, 50]
    assert (log.weight, log.dropped, log.first_seq) == (90, 3, 4)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="both"):
        SeqLog(10, max_weight=5)
    with pytest.raises(ValueError, match="positive"):
        SeqLog(10, max_weight=0, weigh=len)


def test_the_runtime_weighs_events_by_their_tokens() -> None:
    stored = BlockStored([b"a", b"b"], None, list(range(32)), 16, None, "GPU", None)
    assert event_weight(stored) == 1 + 32 + 2
    assert event_weight(BlockRemoved([b"a"], "GPU")) == 2
    rt = PoolRuntime(RuntimeConfig(num_blocks=300, block_size=16, event_log_max_tokens=1000))
    for i in range(20):  # 20 admissions of 160 tokens, no eviction: one BlockStored each (171)
        rt.apply(AdmitOp(request_id=f"r{i}", token_ids=[i * 1000 + t for t in range(160)]))
        rt.apply(FinishOp(request_id=f"r{i}"))
    ev = rt.events
    assert ev.last_seq == 20 and ev.weight == 5 * 171 and len(ev) == 5
    assert ev.dropped == 15 and ev.first_seq == 16
    assert ev.weight == sum(event_weight(e) for _, _, e in ev.since(0, 100)[0])
    rt.check()


@pytest.mark.parametrize("capacity", [1, 2, 7, 50])
def test_since_returns_the_same_entries_from_either_end(capacity: int) -> None:
    """A reader near the newest end is served from there: every (seq, limit)
    gets exactly the entries after seq, oldest first, at most limit."""
    log: SeqLog[int] = SeqLog(capacity)
    log.extend(1.0, range(1, 31))  # seqs 1..30, item == seq
    held = list(range(max(1, 31 - capacity), 31))
    for seq in range(0, 32):
        for limit in (0, 1, 2, 3, 5, 40):
            got, cut = log.since(seq, limit)
            assert [s for s, _, _ in got] == [x for _, _, x in got]
            assert [s for s, _, _ in got] == [s for s in held if s > seq][:limit]
            assert cut is (seq + 1 < held[0])
