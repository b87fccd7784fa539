"""Gap detection, replays racing live batches, restarts -- the rebuilt map
equals the truth computed from the event sequence.  No sockets here: a
simulated network feeds a Source the way its socket loop would."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from app.observer.source import Source
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from blockpool.kvevents.config import SourceSpec
from tests.kvevents.helpers import Workload, as_bytes_truth, map_tagged, positional, truth

Encoder = Callable[[list[KVCacheEvent]], bytes]
ENCODERS: dict[str, Encoder] = {
    "positional": positional,
    "map": map_tagged,
    "map-bytes": lambda evs: map_tagged(evs, as_bytes=True),
}


def source(replay: bool = True, **kw: Any) -> Source:
    spec = SourceSpec("s", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2" if replay else None, 0)
    s = Source(spec, **kw)
    s.applied_seqs = []  # type: ignore[attr-defined]
    inner = s.tracker._apply_fn

    def record(seq: int, payload: bytes) -> bool:
        s.applied_seqs.append(seq)  # type: ignore[attr-defined]
        try:
            return inner(seq, payload)
        finally:
            s.state.check()  # the kept figures equal a recount after every batch

    s.tracker._apply_fn = record
    return s


def expected(batches: list[list[KVCacheEvent]], enc: str) -> dict[Any, int]:
    t = truth(batches)
    return as_bytes_truth(t) if enc == "map-bytes" else t


def simulated(
    seed: int, w: Workload, n: int, encode: Encoder, **how: Any
) -> tuple[Workload, list[list[KVCacheEvent]], Source]:
    """``n`` batches of ``w`` through ``simulate`` (random by ``seed``) into a
    fresh source: the workload, the batches and the source."""
    batches = w.batches(n)
    s = source()
    simulate(s, [encode(evs) for evs in batches], random.Random(seed), **how)
    return w, batches, s


def simulate(
    s: Source,
    payloads: list[bytes],
    rng: random.Random,
    drop: float,
    window: int | None = None,
    max_delay: int = 5,
    serve: bool = True,
) -> None:
    """Publisher time i publishes batch i.  Live delivery drops each batch
    with probability ``drop``.  A replay asked at time t is answered at
    t + delay (live batches keep arriving meanwhile and are buffered) with
    what the publisher holds then: batches [start, t + delay] that are still
    within the last ``window`` published."""
    t = 0
    n = len(payloads)
    outstanding: tuple[int, int] | None = None  # (start, answer time)
    while t < n or outstanding is not None:
        if t < n and rng.random() >= drop:
            start = s.feed_live(t, payloads[t])
            if start is not None:
                assert outstanding is None
                outstanding = (start, t + rng.randint(0, max_delay))
        if outstanding is not None and (t >= outstanding[1] or t >= n - 1):
            start, _ = outstanding
            outstanding = None
            if not serve:
                nxt = s.tracker.on_replay_failed("simulated timeout")
            else:
                newest = min(t, n - 1)
                oldest = 0 if window is None else max(0, newest - window + 1)
                for q in range(max(start, oldest), newest + 1):
                    s.tracker.on_replay(q, payloads[q])
                nxt = s.tracker.on_replay_end()
            if nxt is not None:
                outstanding = (nxt, t + rng.randint(0, max_delay))
        t += 1


@pytest.mark.parametrize("enc", sorted(ENCODERS))
def test_in_order_stream_rebuilds_the_map_exactly(enc: str) -> None:
    w = Workload(seed=1)
    batches = w.batches(200)
    s = source()
    for i, evs in enumerate(batches):
        assert s.feed_live(i, ENCODERS[enc](evs)) is None
    assert s.state.copies() == expected(batches, enc)
    if enc != "map-bytes":
        assert s.state.copies() == w.pool_copies()
    t = s.tracker
    assert (t.exact, t.gaps, t.missed, t.replays, t.batches) == (True, 0, 0, 0, 200)
    assert s.encodings == {"positional" if enc == "positional" else "map": 200}
    w.check()


@pytest.mark.parametrize("seed", range(12))
def test_gaps_filled_by_racing_replays_give_the_truth(seed: int) -> None:
    enc = sorted(ENCODERS)[seed % 3]
    w, batches, s = simulated(seed, Workload(seed=100 + seed), 300, ENCODERS[enc], drop=0.15)
    t = s.tracker
    assert s.applied_seqs == list(range(300))  # type: ignore[attr-defined]
    assert s.state.copies() == expected(batches, enc)
    assert t.exact and t.missed == 0 and t.replay_failures == 0
    assert t.gaps > 0 and t.replays >= t.gaps
    assert not t.replaying and not t.pending
    w.check()


@pytest.mark.parametrize("seed", range(8))
def test_a_short_replay_buffer_loses_batches_visibly(seed: int) -> None:
    w, batches, s = simulated(
        seed, Workload(seed=200 + seed), 250, positional, drop=0.3, window=2, max_delay=8
    )
    applied: list[int] = s.applied_seqs  # type: ignore[attr-defined]
    assert applied == sorted(set(applied))  # strictly in order, each once
    t = s.tracker
    # batches between the first and the last applied that never came: missed
    assert t.missed == len(set(range(applied[0], applied[-1] + 1)) - set(applied))
    # the state is exactly the truth of what was applied ...
    assert s.state.copies() == truth([batches[i] for i in applied])
    losses = set(range(applied[-1] + 1)) - set(applied)
    if losses:
        # ... and the pool says it may be wrong, unless a clear came after the loss
        last_loss = max(losses)
        cleared_after = any(
            isinstance(ev, AllBlocksCleared) for i in applied if i > last_loss for ev in batches[i]
        )
        assert t.exact is cleared_after
        assert t.replay_failures > 0
    else:
        assert t.exact
    w.check()


def test_a_replayed_store_never_resurrects_a_block_removed_later() -> None:
    stored = BlockStored(
        block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2,
        lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip
    batches: list[list[KVCacheEvent]] = [
        [stored],
        [BlockRemoved(block_hashes=[1], medium="GPU")],
        [stored],  # stored again
        [BlockRemoved(block_hashes=[1], medium="GPU")],
    ]
    p = [positional(b) for b in batches]
    s = source()
    s.feed_live(0, p[0])
    assert s.feed_live(2, p[2]) == 1  # gap: batch 1 missed -> replay from 1
    assert s.feed_live(3, p[3]) is None  # buffered during the replay
    assert s.state.copies() == {1: 1}  # nothing applied out of order
    for q in (1, 2, 3):  # the replay runs ahead of what arrived live
        s.tracker.on_replay(q, p[q])
    assert s.tracker.on_replay_end() is None
    assert s.state.copies() == {}  # batch 3's removal is the last word
    assert s.tracker.duplicates == 2 and s.tracker.exact


def test_replay_timeout_applies_what_was_buffered_and_says_so() -> None:
    w = Workload(seed=5)
    batches = w.batches(10)
    p = [positional(b) for b in batches]
    s = source()
    for i in (0, 1, 2):
        s.feed_live(i, p[i])
    assert s.feed_live(5, p[5]) == 3
    s.feed_live(6, p[6])
    assert s.tracker.on_replay_failed("no answer") is None
    t = s.tracker
    assert s.applied_seqs == [0, 1, 2, 5, 6]  # type: ignore[attr-defined]
    assert (t.replay_failures, t.missed, t.exact) == (1, 2, False)
    assert t.reason == "batches 3..4 were lost"
    assert t.last_failure == "no answer"
    # a stale reply after giving up changes nothing
    s.tracker.on_replay(3, p[3])
    assert t.stale_replies == 1 and s.applied_seqs[-1] == 6  # type: ignore[attr-defined]
    w.check()


def test_restart_resets_the_state_and_follows_the_new_publisher() -> None:
    w1, w2 = Workload(seed=8), Workload(seed=9)
    old, new = w1.batches(30), w2.batches(20)
    s = source(replay=False)
    for i, evs in enumerate(old):
        s.feed_live(i, positional(evs))
    assert s.state.copies() == truth(old)
    for i, evs in enumerate(new):  # seq goes back to 0: a new publisher
        s.feed_live(i, map_tagged(evs))
    t = s.tracker
    assert t.restarts == 1 and s.resets == 1
    assert s.state.copies() == truth(new) == w2.pool_copies()
    assert t.exact  # the new stream was seen from seq 0
    w1.check()
    w2.check()


def test_restart_seen_mid_stream_asks_for_the_new_history() -> None:
    w = Workload(seed=10)
    batches = w.batches(12)
    p = [positional(b) for b in batches]
    s = source()
    for i in range(8):
        s.feed_live(i, p[i])
    # the publisher restarted; we first hear its seq 3 -> replay from 0.  The
    # new process stamps its batches anew: not byte-identical to the old ones
    n = [positional(b, ts=2.0) for b in batches]
    assert s.feed_live(3, n[3]) == 0
    for q in range(0, 5):
        s.tracker.on_replay(q, n[q])
    assert s.tracker.on_replay_end() is None
    for i in range(5, 12):
        s.feed_live(i, n[i])
    assert s.tracker.restarts == 1 and s.tracker.exact
    assert s.state.copies() == truth(batches)
    w.check()


def test_join_mid_stream_bootstraps_from_seq_0_when_the_buffer_has_it() -> None:
    w = Workload(seed=11)
    batches = w.batches(40)
    p = [positional(b) for b in batches]
    s = source()
    assert s.feed_live(25, p[25]) == 0  # joined late: ask for everything
    for q in range(0, 27):
        s.tracker.on_replay(q, p[q])
    s.feed_live(26, p[26])
    assert s.tracker.on_replay_end() is None
    for i in range(27, 40):
        s.feed_live(i, p[i])
    assert s.tracker.exact and s.tracker.first_seq == 0
    assert s.state.copies() == truth(batches) == w.pool_copies()
    w.check()


def test_join_mid_stream_without_replay_is_inexact_until_a_clear() -> None:
    stored = BlockStored(
        block_hashes=[4], parent_block_hash=None, token_ids=[1], block_size=1,
        lora_id=None, medium=None, lora_name=None,
    )  # fmt: skip
    s = source(replay=False)
    s.feed_live(7, positional([stored]))
    t = s.tracker
    assert not t.exact and t.reason == "joined at seq 7: earlier batches not seen"
    assert t.gaps == 0 and t.missed == 0  # not a gap: history we never had
    s.feed_live(8, positional([BlockRemoved(block_hashes=[99], medium=None)]))
    assert s.state.unknown_removals == 1
    s.feed_live(9, positional([AllBlocksCleared(), stored]))
    assert t.exact and t.reason is None
    assert s.state.copies() == {4: 1}


def test_undecodable_batches_are_counted_and_make_the_state_inexact() -> None:
    s = source(replay=False)
    s.feed_live(0, positional([]))
    s.feed_live(1, b"\xc1garbage")
    s.feed_live(2, msgpack.packb({"nope": 1}))
    t = s.tracker
    assert (t.decode_errors, t.batches, t.exact, t.applied) == (2, 3, False, 2)


def test_too_many_live_batches_during_a_replay_abandon_it() -> None:
    w = Workload(seed=12)
    batches = w.batches(12)
    p = [positional(b) for b in batches]
    s = source(max_pending=3)
    s.feed_live(0, p[0])
    assert s.feed_live(2, p[2]) == 1
    gen = s.tracker.replay_gen
    for i in range(3, 6):
        s.feed_live(i, p[i])
    t = s.tracker
    assert not t.replaying and t.replay_gen > gen  # abandoned: replies now stale
    assert t.replay_failures == 1 and t.missed == 1
    assert s.applied_seqs == [0, 2, 3, 4, 5]  # type: ignore[attr-defined]
    w.check()


def test_duplicate_hashes_and_media_are_counted_per_copy() -> None:
    def st(h: int, medium: str | None) -> BlockStored:
        return BlockStored(
            block_hashes=[h], parent_block_hash=None, token_ids=[1, 2], block_size=2,
            lora_id=None, medium=medium, lora_name=None,
        )  # fmt: skip

    s = source(replay=False)
    s.feed_live(0, positional([st(1, "GPU"), st(1, "GPU"), st(1, "CPU")]))
    e = s.state.entries[1]
    assert (e.copies, e.media) == (3, {"GPU": 2, "CPU": 1})
    s.feed_live(1, positional([BlockRemoved(block_hashes=[1], medium="CPU")]))
    assert (e.copies, e.media) == (2, {"GPU": 2})
    s.feed_live(2, positional([BlockRemoved(block_hashes=[1], medium="disk")]))
    assert s.state.unknown_removals == 0 and e.copies == 1  # one medium left: that one
    s.feed_live(3, positional([BlockRemoved(block_hashes=[1], medium="GPU")]))
    assert s.state.copies() == {} and s.state.blocks == 0
