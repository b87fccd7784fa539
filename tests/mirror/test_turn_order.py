"""What the plugin's thread does in a turn (a forward pass it is woken for),
in order: the batches queued, the control socket, the snapshots, a beat when
due -- and last the digest's reading, which the engine's return from its pass
interrupts; after it the thread goes straight back to waiting for the next
turn, so that no more of its Python runs while the engine schedules."""

from __future__ import annotations

import time

import pytest

from blockpool.mirror import protocol as wire
from blockpool_vllm import sender as sender_module
from blockpool_vllm.sender import Sender
from tests.mirror.workload import FollowedEngine


class FakePub:
    def __init__(self, did: list[str]) -> None:
        self.did = did

    def send_multipart(self, frames: list[bytes]) -> None:
        assert frames[0] == wire.TOPIC
        self.did.append("publish")


def batch(seq: int) -> wire.Batch:
    return wire.Batch(
        seq=seq, step=seq, ts=time.time(), first_op=0, ops=[], requests=[], stats=(0, 0, 0), drops=0
    )


class RecordingSender(Sender):
    did: list[str]

    def _serve_control(self, ctl: object) -> None:  # noqa: ARG002 (the socket: none here)
        self.did.append("control")

    def _snapshots(self, ctl: object) -> None:  # noqa: ARG002 (the socket: none here)
        self.did.append("snapshots")


def a_sender(did: list[str], turns: int) -> Sender:
    """A sender whose every part records itself in ``did``; it stops at its
    ``turns + 1``-th wait for a turn."""
    waits = 0

    def turn(timeout: float, queued: bool) -> bool:  # noqa: ARG001 (the sender's turn)
        nonlocal waits
        waits += 1
        did.append("wait")
        if waits > turns:
            sender._stop.set()
            return False
        return True

    def prepare(b: wire.Batch) -> wire.Batch:
        did.append("prepare")
        return b

    sender = RecordingSender(
        "tcp://127.0.0.1:1",
        FollowedEngine(num_blocks=64).hello,
        lambda: None,
        lambda: (0, 0, 0),
        background=lambda: did.append("read"),
        prepare=prepare,
        turn=turn,
    )
    sender._last_hello = time.monotonic()  # (a handshake just sent)
    sender.did = did
    return sender


def test_a_turn_reads_last_then_waits() -> None:
    did: list[str] = []
    sender = a_sender(did, turns=2)
    assert sender.offer(batch(1))
    with pytest.raises(sender_module._Stop):
        sender._loop(FakePub(did), None)
    turn = ["control", "snapshots", "read", "wait"]
    assert did == ["wait", "prepare", "publish", *turn, *turn]
    assert sender.sent == 1 and sender.dropped == 0


def test_a_beat_due_goes_out_before_the_reading() -> None:
    did: list[str] = []
    sender = a_sender(did, turns=1)
    sender._last_sent -= sender_module.BEAT_EVERY_S  # (a beat due)
    with pytest.raises(sender_module._Stop):
        sender._loop(FakePub(did), None)
    assert did == ["wait", "control", "snapshots", "publish", "read", "wait"]
