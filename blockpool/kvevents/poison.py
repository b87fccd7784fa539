"""Poison messages of one observed stream, counted by kind and logged once
per kind (then at most once per ``interval`` seconds, with the count), so
that a stranger flooding bad messages can neither go unseen nor flood the
log.

Kinds: ``bad_frames`` (not topic / 8-byte seq / payload), ``too_large``,
``too_deep``, ``not_msgpack``, ``not_a_batch`` (the batch is refused),
``malformed_event`` / ``bad_number`` (one event skipped), ``non_finite_ts``
(the batch's ts replaced by the observer's clock), ``extra_cut`` (unknown
fields trimmed), ``internal_error`` (an exception handling a message: that
message only).
"""

from __future__ import annotations

import logging
import time

# Every kind above: the metrics export each at 0 from the start, so that a
# dashboard shows "0", not "No data", until the first poison message.
KINDS = (
    "bad_frames", "too_large", "too_deep", "not_msgpack", "not_a_batch",
    "malformed_event", "bad_number", "non_finite_ts", "extra_cut", "internal_error",
    "replay_out_of_range",
)  # fmt: skip


class PoisonCounter:
    def __init__(self, name: str, logger: logging.Logger, interval: float = 60.0) -> None:
        self.name = name
        self.logger = logger
        self.interval = interval
        self.counts: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}
        self._logged_count: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def by_kind(self) -> dict[str, int]:
        """Every known kind (0 when none yet), then any other counted."""
        return {**dict.fromkeys(KINDS, 0), **self.counts}

    def add(self, kind: str, detail: str, n: int = 1) -> None:
        count = self.counts[kind] = self.counts.get(kind, 0) + n
        now = time.monotonic()
        last = self._logged_at.get(kind)
        if last is not None and now - last < self.interval:
            return
        since = count - self._logged_count.get(kind, 0)
        self._logged_at[kind] = now
        self._logged_count[kind] = count
        self.logger.warning(
            "%s: poison message (%s): %s -- %d of this kind so far (%d since the last report)",
            self.name, kind, detail[:200], count, since,
        )  # fmt: skip
