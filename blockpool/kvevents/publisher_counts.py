"""The KV-event publisher's counters, and the HELP of each figure it gives
/metrics."""

from __future__ import annotations

from dataclasses import dataclass

from blockpool.common.figures import counter, helps


@dataclass
class PublisherCounts:
    batches_queued: int = counter("Batches queued for the publisher thread.")
    batches_published: int = counter("Batches sent on the PUB socket.")
    events_published: int = counter("Events sent on the PUB socket.")
    bytes_published: int = counter("Bytes of batch payloads sent on the PUB socket.")
    batches_dropped: int = counter(
        "Batches not sent (queue or socket full, events lost): a seq gap subscribers see."
    )
    events_dropped: int = counter("Events of the dropped batches.")
    send_errors: int = counter("Batches whose encoding or send failed.")
    replay_requests: int = counter("Replay requests received on the ROUTER socket.")
    replay_batches_sent: int = counter("Batches sent in answer to replay requests.")
    replay_invalid: int = counter("Replay requests that were not [identity, '', 8-byte seq].")
    replay_aborted: int = counter("Replays abandoned: the requester went away.")
    replay_refused: int = counter("Replay requests answered at once with END: too many at once.")
    buffer_evicted: int = counter("Batches pushed out of the replay buffer by newer ones.")


PUBLISHER_HELP = {
    **helps(PublisherCounts),
    "queue_batches": "Batches queued for the publisher thread now.",
    "queue_capacity_batches": "Batches the publisher's queue holds at most.",
    "buffer_batches": "Batches in the replay buffer now.",
    "buffer_capacity_batches": "Batches the replay buffer holds at most.",
    "last_seq": "The last seq published (-1: none yet).",
    "running": "1 while the publisher thread runs.",
}
