"""Replays in both layouts a vLLM publisher answers with, told apart per
reply: vLLM 0.16's three frames (``b""``, seq, payload) and vLLM 0.24 on's
four (``b""``, topic, seq, payload; the end marker ``b""``, ``b""``,
``END_SEQ``, ``b""``) -- over real sockets, from a scripted ROUTER."""

from __future__ import annotations

import asyncio

import pytest

from blockpool.kvevents.replay_frames import REPLAY_TOPIC, REPLAY_V016, replay_layout
from tests.kvevents.helpers import END_SEQ, Workload, fake_publisher, positional, truth
from tests.kvevents.test_observer import observing, settled

SEQ5 = (5).to_bytes(8, "big")


@pytest.mark.parametrize("layout", [REPLAY_V016, REPLAY_TOPIC])
def test_a_late_join_and_a_gap_are_replayed_in_either_layout(layout: str) -> None:
    w = Workload(seed=71)
    batches = w.batches(60)

    async def main() -> None:
        with fake_publisher(topic=b"kv", replay_layout=layout) as fp:
            for i in range(30):  # published before the observer existed
                fp.record(i, positional(batches[i]))
            async with observing(fp, topic="kv") as s:
                fp.send(30, positional(batches[30]))  # the join: replay from 0
                await settled(s, 30)
                fp.record(31, positional(batches[31]))  # lost on the way: a gap
                for i in range(32, 60):
                    fp.send(i, positional(batches[i]))
                await settled(s, 59)
                t = s.tracker
                assert fp.requests == [0, 31]
                assert t.exact and t.first_seq == 0 and t.missed == 0 and t.gaps == 1
                # 0..30, then 31 and whatever of 32.. the buffer held by then
                assert t.replay_failures == 0 and t.replay_batches >= 32
                # every reply (the batches and 2 end markers) read in the layout sent
                replies = t.replay_batches + 2
                assert s.replay_layouts == {layout: replies}
                assert s.poison.total == 0 and s.bad_messages == 0
                assert s.state.copies() == truth(batches) == w.pool_copies()
                health = s.health()
                assert health["replay_layouts"] == {layout: replies} and health["exact"]
        w.check()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("frames", "layout"),
    [
        ([b"", SEQ5, b"payload"], REPLAY_V016),
        ([b"", END_SEQ, b""], REPLAY_V016),
        ([b"", b"kv", SEQ5, b"payload"], REPLAY_TOPIC),
        ([b"", b"kv-rank1", SEQ5, b"payload"], REPLAY_TOPIC),  # a topic under ours
        ([b"", b"", END_SEQ, b""], REPLAY_TOPIC),
        ([b"", b"other", SEQ5, b"payload"], None),  # another topic
        ([b"", b"", SEQ5, b"payload"], None),  # no topic, not the end marker
        ([b"", b"kv", END_SEQ, b""], None),  # vLLM's end marker has no topic
        ([b"x", SEQ5, b"payload"], None),  # no delimiter
        ([b"", SEQ5[:7], b"payload"], None),  # a 7-byte seq
        ([b"", b"kv", SEQ5, b"p", b"extra"], None),
        ([b""], None),
        ([], None),
    ],
)
def test_each_reply_is_read_in_its_own_layout(frames: list[bytes], layout: str | None) -> None:
    assert replay_layout(frames, b"kv") == layout


def test_a_reply_in_neither_layout_is_counted_and_changes_nothing() -> None:
    w = Workload(seed=72)
    batches = w.batches(12)

    async def main() -> None:
        with fake_publisher(topic=b"kv", replay_layout=REPLAY_TOPIC) as fp:
            for i in range(10):
                fp.record(i, positional(batches[i]))
            async with observing(fp, topic="kv", replay_timeout=30.0) as s:
                sockets = s.sockets
                fp.send(10, positional(batches[10]))
                await settled(s, 10)
                before = (s.state.copies(), s.tracker.applied, dict(s.replay_layouts))
                # a reply in no layout, handled as the socket loop handles one
                sockets._replay_outstanding = s.tracker.replay_gen
                s.tracker.replaying = True
                bogus = [b"", b"other", (3).to_bytes(8, "big"), positional(batches[3])]
                assert sockets._guarded(sockets._replayed, bogus) is None
                s.tracker.replaying = False
                sockets._replay_outstanding = None
                assert s.poison.counts == {"bad_frames": 1} and s.bad_messages == 1
                assert (s.state.copies(), s.tracker.applied, dict(s.replay_layouts)) == before
                fp.send(11, positional(batches[11]))
                await settled(s, 11)
                assert s.tracker.exact and s.state.copies() == truth(batches)
        w.check()

    asyncio.run(main())
