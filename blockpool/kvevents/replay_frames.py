"""The layouts of a KV-event replay reply, as a DEALER reads them (the
ROUTER's identity frame stripped), one home for the publisher that writes
them (``replay_router.py``) and the observer that reads them.

``REPLAY_V016``: vLLM 0.16's (and blockpool's under the ``v016`` form)
``[b"", seq, payload]``, the end marker ``[b"", END_SEQ, b""]``.
``REPLAY_TOPIC``: vLLM 0.24 on's (0.32 checked; blockpool's under the
``map`` form) ``[b"", topic, seq, payload]``, the end marker
``[b"", b"", END_SEQ, b""]`` (its topic frame empty).
"""

from __future__ import annotations

from blockpool.kvevents.config import END_SEQ

REPLAY_V016 = "v016"
"""vLLM 0.16's replay reply as a DEALER reads it: ``b""``, seq, payload
(the end marker ``b""``, ``END_SEQ``, ``b""``); blockpool's publisher too."""
REPLAY_TOPIC = "topic"
"""vLLM 0.24 on: ``b""``, topic, seq, payload -- the end marker
``b""``, ``b""``, ``END_SEQ``, ``b""`` (its topic frame is empty)."""

REPLAY_LAYOUTS = (REPLAY_V016, REPLAY_TOPIC)


def replay_layout(frames: list[bytes], topic: bytes) -> str | None:
    """Which layout one replay reply has (``REPLAY_V016`` / ``REPLAY_TOPIC``),
    None when it has neither: the empty delimiter, an 8-byte seq, and in
    the 4-frame form a topic under the one subscribed to (empty on the end
    marker).  Told per reply: an observer may follow publishers of both
    releases, and a publisher may be upgraded while followed."""
    if not frames or frames[0] != b"":
        return None
    if len(frames) == 3 and len(frames[1]) == 8:
        return REPLAY_V016
    if len(frames) == 4 and len(frames[2]) == 8:
        end = frames[2] == END_SEQ
        if (end and frames[1] == b"") or (not end and frames[1].startswith(topic)):
            return REPLAY_TOPIC
    return None
