"""The fan-out both websockets share (app/web/broadcast.py): one encoded item
for every subscriber, a full queue dropped and counted, the resync it needs."""

from __future__ import annotations

import asyncio

from app.web.broadcast import BroadcastCounts, Broadcaster, Subscriber


def drain(sub: Subscriber[str]) -> list[str]:
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


def test_a_slow_subscriber_is_dropped_and_resynced_the_others_get_everything() -> None:
    async def main() -> None:
        fan: Broadcaster[str] = Broadcaster(BroadcastCounts())
        fast = fan.add(Subscriber(queue_size=8))
        slow = fan.add(Subscriber(queue_size=3))
        notices = 0

        def notice() -> str:
            nonlocal notices
            notices += 1
            return "resync"

        got: list[str] = []
        for i in range(5):
            fan.publish(f"m{i}", notice)
            got += drain(fast)
        assert got == ["m0", "m1", "m2", "m3", "m4"]
        # m0..m2 filled the slow queue; m3 found it full: dropped, resync queued;
        # m4 then fits behind the notice
        assert drain(slow) == ["resync", "m4"]
        assert (slow.drops, slow.resyncs, fast.drops) == (1, 1, 0)
        assert (fan.counts.drops, fan.counts.resyncs, notices) == (1, 1, 1)
        assert not slow.needs_resync

    asyncio.run(main())


def test_without_a_notice_the_subscriber_waits_marked_for_a_resync() -> None:
    async def main() -> None:
        fan: Broadcaster[bytes] = Broadcaster(seq_of=lambda b: b[0])
        sub = fan.add(Subscriber(queue_size=2, needs_resync=False))
        assert fan.offer(sub, b"\x01") and fan.offer(sub, b"\x02")
        assert not fan.offer(sub, b"\x03")
        assert sub.queue.empty() and sub.needs_resync and fan.counts.drops == 1
        fan.resync(sub)  # asked for: counted, still waiting for its snapshot
        assert sub.needs_resync and fan.counts.resyncs == 1
        fan.sent(sub, b"\x07abc")
        assert (sub.frames, sub.bytes, sub.last_sent_seq) == (1, 4, 7)
        assert (fan.counts.frames, fan.counts.bytes, fan.max_lag(10)) == (1, 4, 3)
        fan.remove(sub)
        fan.remove(sub)  # twice: counted once
        assert len(fan) == 0 and fan.counts.disconnects == 1

    asyncio.run(main())
