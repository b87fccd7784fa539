"""Sequence tracking for one KV-event stream: gaps, replays, restarts.

Pure logic, no sockets: the driver feeds it live messages, replay messages
and replay ends/failures; it calls ``apply(seq, payload)`` for each batch in
sequence order, exactly once, and tells the driver when to ask the replay
socket for missed batches (the returned start seq).

* **Gap** -- a live seq past the next expected one.  With a replay socket the
  tracker asks for the batches from the next expected seq and *buffers every
  live batch* until the replay ends, so batches are applied strictly in seq
  order: a replayed BlockStored can never resurrect a block that a later
  (already received) BlockRemoved took away.  Batches the replay cannot give
  (the publisher's buffer rolled past them, or they were dropped before
  they were sent) are counted as missed and the state marked inexact.
* **Join** -- the first batch seen.  Its seq is 0 when the publisher just
  started; otherwise, with a replay socket, the tracker first asks for
  everything from seq 0 (vLLM keeps the last ``buffer_steps`` batches).
* **Duplicates** -- the replay may run ahead of the live stream, so a live
  batch may already have been applied: skipped, counted.  A live message
  repeated byte for byte (the same seq and payload as one of the last
  ``DUPLICATE_WINDOW`` received) is a duplicate too: skipped, counted, the
  state kept.
* **Restart** -- the *live* seq goes back with a payload other than the one
  first received at that seq (a PUB socket delivers one publisher's
  messages in order, so only a new publisher does that): the state is reset
  and the stream followed from the new seq, as a join.
* **Replay range** -- a replayed seq more than ``replay_ahead`` past the
  newest live seq cannot be one the publisher has sent: the replay is given
  up (counted in ``replay_out_of_range``), so that a bogus seq can never
  make the live batches after it look like duplicates.
* **Exact** -- true when every batch since seq 0 (or since an
  AllBlocksCleared) was applied; false, with a reason, otherwise.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

from blockpool.kvevents.decode import DecodeError

Apply = Callable[[int, bytes], bool]  # returns True when the batch cleared the cache

DUPLICATE_WINDOW = 1024
"""Live messages remembered (seq and a digest of the payload) to tell a
repeated message from a restarted publisher."""
REPLAY_AHEAD = 10_000
"""How far past the newest live seq a replay may run (batches still on their
way on the live socket)."""


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=16).digest()


class SeqTracker:
    def __init__(
        self,
        apply: Apply,
        on_restart: Callable[[], None],
        has_replay: bool,
        max_pending: int = 100_000,
        replay_ahead: int = REPLAY_AHEAD,
    ) -> None:
        self._apply_fn = apply
        self._on_restart = on_restart
        self.has_replay = has_replay
        self.max_pending = max_pending
        self.replay_ahead = replay_ahead
        self._recent: OrderedDict[int, bytes] = OrderedDict()  # live seq -> payload digest
        self.applied: int | None = None  # the last seq applied (or given up)
        self.live_last: int | None = None  # the last live seq received
        self.replaying = False
        self.replay_start: int | None = None
        self.replay_gen = 0  # bumped when a replay starts or is abandoned
        self.pending: list[tuple[int, bytes]] = []
        self.exact = False
        self.reason: str | None = "no batch seen yet"
        self.first_seq: int | None = None
        # counters
        self.received = 0  # live messages
        self.batches = 0  # batches applied
        self.duplicates = 0
        self.gaps = 0
        self.missed = 0  # batches never recovered
        self.replays = 0
        self.replay_batches = 0
        self.replay_failures = 0
        self.stale_replies = 0
        self.live_duplicates = 0  # live messages received twice (skipped)
        self.replay_out_of_range = 0  # replayed seqs past the live stream (replay given up)
        self.restarts = 0
        self.decode_errors = 0
        self.apply_errors = 0  # batches whose apply raised (anything but DecodeError)
        self.last_failure: str | None = None
        self._replay_short = False
        self._lossy: str | None = None

    # --------------------------------------------------------------- inputs

    def on_live(self, seq: int, payload: bytes) -> int | None:
        """A live message; returns the seq to request a replay from, if any."""
        self.received += 1
        digest = _digest(payload)
        if self.live_last is not None and seq <= self.live_last:
            if self._recent.get(seq) == digest:
                self.live_duplicates += 1  # the same message again: nothing to do
                self.duplicates += 1
                return None
            self._restart(seq)
        self.live_last = seq
        recent = self._recent
        recent[seq] = digest
        if len(recent) > DUPLICATE_WINDOW:
            recent.popitem(last=False)
        if self.replaying:
            self.pending.append((seq, payload))
            if len(self.pending) > self.max_pending:
                return self.on_replay_failed(
                    f"more than {self.max_pending} live batches arrived during the replay"
                )
            return None
        return self._process(seq, payload, allow_replay=True)

    def on_replay(self, seq: int, payload: bytes) -> int | None:
        """One replayed batch (of the current replay); returns the seq to
        request a new replay from, if giving this one up calls for one."""
        if not self.replaying:
            self.stale_replies += 1
            return None
        self.replay_batches += 1
        if self.applied is not None and seq <= self.applied:
            self.duplicates += 1
            return None
        newest = self.live_last if self.live_last is not None else -1
        if seq > newest + self.replay_ahead:
            self.replay_out_of_range += 1
            return self.on_replay_failed(
                f"the replay sent seq {seq}, more than {self.replay_ahead} past the newest "
                f"live seq {newest}"
            )
        # A replay may run past what arrived live: the live copies of those
        # batches are skipped as duplicates when the buffer is drained.
        expected = 0 if self.applied is None else self.applied + 1
        if seq != expected:
            # the publisher no longer holds (or never sent) these batches
            self._replay_short = True
            self._lost(expected, seq)
        self._apply(seq, payload)
        return None

    def on_replay_end(self) -> int | None:
        """The replay's end marker arrived."""
        if not self.replaying:
            self.stale_replies += 1
            return None
        self.replaying = False
        reason = "the replay buffer no longer held every missed batch"
        first_new = next(
            (q for q, _ in self.pending if self.applied is None or q > self.applied), None
        )
        expected = 0 if self.applied is None else self.applied + 1
        if first_new is not None and first_new != expected:
            self._replay_short = True
            reason = f"the replay did not reach seq {first_new - 1}"
        if self._replay_short:
            self.replay_failures += 1
            self.last_failure = reason
            self._replay_short = False
        return self._drain()

    def on_replay_failed(self, reason: str) -> int | None:
        """The replay timed out, could not be sent, or overflowed: give up
        on it and apply what was buffered."""
        if not self.replaying:
            return None
        self.replaying = False
        self.replay_gen += 1
        self.replay_failures += 1
        self.last_failure = reason
        self._replay_short = False
        return self._drain()

    # ------------------------------------------------------------- internals

    def _restart(self, seq: int) -> None:
        self.restarts += 1
        self._on_restart()
        self.applied = None
        self.first_seq = None
        self.pending = []
        self._recent.clear()
        if self.replaying:
            self.replaying = False
            self.replay_gen += 1
        self.exact = False
        self.reason = f"publisher restarted (seq went back to {seq})"

    def _process(self, seq: int, payload: bytes, allow_replay: bool) -> int | None:
        if self.applied is not None and seq <= self.applied:
            self.duplicates += 1
            return None
        expected = 0 if self.applied is None else self.applied + 1
        if seq != expected:
            if self.applied is not None:
                self.gaps += 1
            if allow_replay and self.has_replay:
                self.replaying = True
                self.replay_start = expected
                self.replay_gen += 1
                self.replays += 1
                self._replay_short = False
                self.pending = [(seq, payload)]
                return expected
            self._lost(expected, seq)
        self._apply(seq, payload)
        return None

    def _drain(self) -> int | None:
        """Apply the batches held during a replay.  A gap right after the
        replay is not asked again (the publisher could not fill it); a later
        gap (batches dropped on the way during the replay) is."""
        pending, self.pending = self.pending, []
        first = True
        for i, (seq, payload) in enumerate(pending):
            if self.applied is not None and seq <= self.applied:
                self.duplicates += 1
                continue
            start = self._process(seq, payload, allow_replay=not first)
            first = False
            if start is not None:
                self.pending.extend(pending[i + 1 :])
                return start
        return None

    def _lost(self, expected: int, seq: int) -> None:
        self.exact = False
        if self.applied is None:
            self.reason = f"joined at seq {seq}: earlier batches not seen"
        else:
            self.missed += seq - expected
            self.reason = f"batches {expected}..{seq - 1} were lost"

    def _apply(self, seq: int, payload: bytes) -> None:
        if self.applied is None:
            self.first_seq = seq
            if seq == 0:
                self.exact = True
                self.reason = None
        self.applied = seq
        self.batches += 1
        self._lossy = None
        try:
            cleared = self._apply_fn(seq, payload)
        except DecodeError as exc:
            self.decode_errors += 1
            self.exact = False
            self.reason = f"batch {seq} could not be decoded: {exc}"
            return
        except Exception as exc:  # a bug or a poison we did not foresee: this batch only
            self.apply_errors += 1
            self.exact = False
            self.reason = f"batch {seq} could not be applied: {exc!r}"[:300]
            return
        if cleared:
            self.exact = True
            self.reason = None
        if self._lossy is not None:
            self.exact = False
            self.reason, self._lossy = self._lossy, None

    def lossy(self, reason: str) -> None:
        """Called by ``apply`` when part of its batch could not be applied
        (events skipped): the state is then a lower bound, not exact."""
        self._lossy = reason
