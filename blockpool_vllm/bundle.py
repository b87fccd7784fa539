"""Batches the sender gathered to publish in one message.

Each message is a few socket calls, and each lets go of the interpreter: an
engine that never waits for its forward passes (vLLM's ``AsyncScheduler`` on
a CPU slower than its GPU) gives it back only after CPython's switch
interval, so what queued while it worked goes out as one ``Batches``
(blockpool/mirror/protocol.py) -- within the wire's size bound, else one
message a batch.  Each batch is encoded as it is added: held as bytes, not
records (a batch's records held a while are the garbage collector's work --
measured: five times the young collections of an async run).
"""

from __future__ import annotations

from collections.abc import Callable

from blockpool.mirror import protocol as wire


class Bundle:
    __slots__ = ("boot", "drops", "encoded", "end_op", "one_message", "published", "seq")

    def __init__(self) -> None:
        self.encoded: list[bytes] = []
        # the last batch's seq and where its operations end, the most drops
        # any said: what a beat claims once these are handled
        self.seq = self.end_op = self.drops = 0
        self.boot = ""
        self.published = 0  # batches that went out
        self.one_message = False  # ... as one Batches

    def __len__(self) -> int:
        return len(self.encoded)

    def add(self, batch: wire.Batch) -> None:
        self.encoded.append(wire.encode(batch))
        self.seq, self.end_op = batch.seq, batch.first_op + len(batch.ops)
        self.drops = max(self.drops, batch.drops)
        self.boot = batch.boot

    def publish(self, send: Callable[[bytes], object]) -> None:
        """Each payload to ``send``: one, or one a batch past the size bound.
        A failure propagates; ``published`` says how many went out before it."""
        encoded = self.encoded
        if len(encoded) > 1:
            payload = wire.encode_batches(encoded, self.boot)
            if len(payload) <= wire.MAX_BATCH_BYTES:
                send(payload)
                self.published, self.one_message = len(encoded), True
                return
        for one in encoded:
            send(one)
            self.published += 1
