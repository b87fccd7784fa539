"""The KV-event publisher's replay ROUTER, served between publishes: a
request ``[identity, b"", start_seq (8 bytes)]`` gets every buffered batch
whose seq >= start, a slice at a time, then ``END_SEQ``; a replay to a peer
that went away is abandoned and counted.

Each reply is laid out as the release the publisher speaks for
(``replay_frames.py``): vLLM 0.16's ``[b"", seq, payload]`` (end
``[b"", END_SEQ, b""]``), or -- given ``topic``, the ``"map"`` form's --
vLLM 0.24 on's ``[b"", topic, seq, payload]`` (end ``[b"", b"", END_SEQ,
b""]``)."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

import zmq

from blockpool.kvevents.config import END_SEQ
from blockpool.kvevents.publisher_counts import PublisherCounts

logger = logging.getLogger("blockpool.kvevents")

REPLAY_SLICE = 256  # replay messages sent per turn of the publisher loop
MAX_REPLAY_JOBS = 64  # concurrent replay requests served; later ones get END at once


class ReplayJob:
    """One replay in progress: its requester, the batches to send, how many
    are sent."""

    __slots__ = ("client", "items", "pos")

    def __init__(self, client: bytes, items: list[tuple[int, bytes]]) -> None:
        self.client = client
        self.items = items
        self.pos = 0


class ReplayRouter:
    """The replays in progress, answered from the publisher's ``buffer``
    of (seq, payload)."""

    def __init__(
        self,
        buffer: deque[tuple[int, bytes]],
        counts: PublisherCounts,
        topic: bytes | None = None,
    ) -> None:
        self.buffer = buffer
        self.counts = counts
        self.jobs: deque[ReplayJob] = deque()
        # the frames between the delimiter and the seq: none (vLLM 0.16), or
        # the topic (vLLM 0.24 on; empty on the end marker)
        self._before_seq: tuple[bytes, ...] = () if topic is None else (topic,)
        self._before_end: tuple[bytes, ...] = () if topic is None else (b"",)

    def take_requests(self, router: zmq.Socket[Any]) -> None:
        for _ in range(64):
            try:
                frames = router.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self.counts.replay_requests += 1
            if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                self.counts.replay_invalid += 1
                logger.warning("KV-event publisher: bad replay request (%d frames)", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            if len(self.jobs) >= MAX_REPLAY_JOBS:
                self.counts.replay_refused += 1
                items: list[tuple[int, bytes]] = []
            else:
                items = [entry for entry in self.buffer if entry[0] >= start]
            self.jobs.append(ReplayJob(client, items))

    def serve(self, router: zmq.Socket[Any]) -> None:
        for _ in range(len(self.jobs)):
            job = self.jobs.popleft()
            try:
                sent = 0
                while job.pos < len(job.items) and sent < REPLAY_SLICE:
                    seq, payload = job.items[job.pos]
                    router.send_multipart(
                        (job.client, b"", *self._before_seq, seq.to_bytes(8, "big"), payload),
                        flags=zmq.NOBLOCK,
                    )
                    job.pos += 1
                    sent += 1
                    self.counts.replay_batches_sent += 1
                if job.pos >= len(job.items):
                    router.send_multipart(
                        (job.client, b"", *self._before_end, END_SEQ, b""), flags=zmq.NOBLOCK
                    )
                    continue  # done
            except zmq.Again:
                pass  # the peer's queue is full: go on next turn
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:  # the requester went away
                    self.counts.replay_aborted += 1
                    continue
                raise
            self.jobs.append(job)
