"""The control socket's counts as another thread reads them: a valid
snapshot request is waiting, or counted as answered or dropped -- never in
neither, not even while the sender's thread is sending the replies (a test
that waited for ``waiting == 0`` read the counts 39 short, CI)."""

from __future__ import annotations

from typing import Any

import zmq

from blockpool.mirror import protocol as wire
from blockpool_vllm.snapshot_requests import SnapshotRequests
from tests.mirror.workload import FollowedEngine


class Control:
    """A control socket whose sends look at the counts first (as a reader
    on another thread may at that moment); every third peer is gone."""

    def __init__(self, reqs: SnapshotRequests) -> None:
        self.reqs = reqs
        self.sent: list[bytes] = []
        self.seen: list[tuple[int, int]] = []

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:  # noqa: ARG002
        r = self.reqs
        self.seen.append(
            (r.snapshots + r.replies_dropped + r.requests_dropped + r.waiting, r.requests)
        )
        identity = frames[0]
        if identity[-1] % 3 == 0:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        self.sent.append(identity)


def test_a_request_is_waiting_or_counted_at_every_moment_of_the_replies() -> None:
    engine = FollowedEngine(num_blocks=64)
    engine.drive(10)
    snap = engine.follower.capture_now()
    reqs = SnapshotRequests(
        lambda: snap, None, snapshot_every_s=0.0, request_ttl_s=60.0, max_waiting=100
    )
    for i in range(12):
        payload = wire.encode(wire.SnapshotRequest(reason="test"))
        reqs._request([b"peer-%d" % i + bytes([i]), payload, b""])
    assert reqs.requests == reqs.waiting == 12
    ctl: Any = Control(reqs)
    reqs._snapshots(ctl)
    assert len(ctl.seen) == 12
    assert all(accounted >= requests for accounted, requests in ctl.seen), ctl.seen
    assert reqs.waiting == 0 and reqs.captures == 1
    assert (reqs.snapshots, reqs.replies_dropped, reqs.requests_dropped) == (8, 4, 0)
    assert len(ctl.sent) == 8
    engine.rt.check()
