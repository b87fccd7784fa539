"""The engine's running and waiting requests, from the plugin's request records.

vLLM's scheduler (v1/core/sched/scheduler.py) holds a request in one of two
queues: ``waiting`` from ``add_request`` until it is scheduled, ``running``
from then until it finishes, and back to ``waiting`` when preempted
(``_preempt_request`` prepends it there) until it is scheduled again.  Its
``vllm:num_requests_running`` is ``len(running)``, ``..._waiting`` the
waiting queue's length.  The records say the same moves:

* ``Arrive`` -> waiting;  ``Scheduled`` -> running (a first scheduling, or a
  preempted request resumed);  ``Preempted`` -> waiting;  ``Finished`` -> gone.

The counts are the engine's only when the mirror heard every record since
the engine had no request: from the plugin's first batch (a mirror started
with the engine), with no batch missed since.  A mirror that joined a busy
engine, or missed a batch, cannot know of the requests it never heard of:
its counts are ``None`` with the reason (``unknown_reason``) until the
engine's run restarts.  A request preempted and not heard of since is
counted as waiting, as vLLM has it until it resumes.

Each change is kept with its engine time (bounded): the counts at a past
moment (time travel) and the requests started and ended between two
moments (the one-minute diff) are read from it.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from blockpool.mirror.protocol import Arrive, Finished, Preempted, Record, Scheduled

WAITING, RUNNING = "waiting", "running"
COUNTS = ("running", "waiting", "admitted", "finished", "refused")
MAX_LIVE = 1_000_000  # requests held at once: past it the counts are not known
MAX_CHANGES = 200_000  # changes kept for past moments (oldest go first)

# a change: (engine time, request id, state before, state after, a first
# scheduling); a state None: not held
Change = tuple[float, str, str | None, str | None, bool]


class EngineQueues:
    def __init__(self, max_live: int = MAX_LIVE, max_changes: int = MAX_CHANGES) -> None:
        self.max_live = max_live
        self.max_changes = max_changes
        self.restart()

    def restart(self) -> None:
        """Nothing heard yet (at start; a new run of the engine: a new boot)."""
        self.state: dict[str, str] = {}  # the requests the engine holds: id -> queue
        self.ran: set[str] = set()  # ... of them, those scheduled once at least
        self.running = 0
        self.waiting = 0
        self.started = 0  # first schedulings heard (vLLM's requests admitted)
        self.ended = 0  # requests finished (or aborted) heard
        self.changes: deque[Change] = deque(maxlen=self.max_changes)
        self.first_seq: int | None = None  # the first batch heard (of this engine run)
        self.last_seq = 0
        # why the counts are not the engine's (None: they are); since when (engine time)
        self.unknown_reason: str | None = "no batch of the engine's heard yet"
        self.known_since: float | None = None
        self.unheard = 0  # records of requests the mirror never heard arrive

    # ------------------------------------------------------------- writing

    def heard(self, seq: int, ts: float) -> None:
        """A handshake or a beat of the engine's: ``seq`` batches sent so far.
        Heard before any batch, it says whether the mirror listens from the
        engine's start (0: no batch made, no request held)."""
        if self.first_seq is not None:
            return
        self.first_seq = self.last_seq = seq
        if seq == 0:
            self.unknown_reason = None
            self.known_since = ts
        else:
            self.unknown_reason = (
                f"the mirror joined the engine after its batch {seq}: the requests it "
                "admitted before are not known here"
            )

    def batch(self, seq: int, ts: float, records: list[Record]) -> None:
        """One batch's records, in the order the engine made them."""
        if self.first_seq is None:
            self.first_seq = seq
            if seq <= 1:
                self.unknown_reason = None
                self.known_since = ts
            else:
                self.unknown_reason = (
                    f"the mirror joined the engine at its batch {seq}: the requests it "
                    "admitted before are not known here"
                )
        elif seq > self.last_seq + 1:
            self._lose(
                f"batches {self.last_seq + 1}..{seq - 1} of the engine's never arrived: "
                "the requests they told of are not known here"
            )
        self.last_seq = max(self.last_seq, seq)
        for rec in records:
            self._record(rec)

    def _lose(self, why: str) -> None:
        if self.unknown_reason is None:
            self.unknown_reason = why
            self.known_since = None

    def _record(self, rec: Record) -> None:
        rid = rec.rid
        before = self.state.get(rid)
        first = False
        if isinstance(rec, Arrive):
            after: str | None = WAITING if before is None else before
        elif isinstance(rec, Scheduled):
            after = RUNNING
            first = before != RUNNING and rid not in self.ran
        elif isinstance(rec, Preempted):
            after = WAITING
        elif isinstance(rec, Finished):
            after = None
            self.ended += 1
        else:  # pragma: no cover - the decoder admits no other record
            return
        if before is None and not isinstance(rec, Arrive):
            self.unheard += 1  # it arrived before the mirror listened
        if after == before:
            return
        if after is None:
            self.state.pop(rid, None)
            self.ran.discard(rid)
        else:
            if before is None and len(self.state) >= self.max_live:
                self._lose(f"the engine holds more than {self.max_live} requests")
                return
            self.state[rid] = after
            if first:
                self.ran.add(rid)
                self.started += 1
        self.running += (after == RUNNING) - (before == RUNNING)
        self.waiting += (after == WAITING) - (before == WAITING)
        self.changes.append((float(rec.ts), rid, before, after, first))

    # ------------------------------------------------------------- reading

    def counts(self) -> dict[str, Any]:
        """``running`` and ``waiting`` now, the requests ``admitted`` (first
        scheduled) and ``finished`` (None: not known, ``reason`` says why)."""
        if self.unknown_reason is not None:
            return dict.fromkeys(COUNTS) | {"reason": self.unknown_reason}
        return {
            "running": self.running,
            "waiting": self.waiting,
            "admitted": self.started,  # since the engine's run started
            "finished": self.ended,
            "refused": None,  # vLLM queues a request, it refuses none for lack of blocks
            "reason": None,
        }

    def running_ids(self) -> list[str]:
        """The requests running now, oldest arrival first."""
        return [rid for rid, st in self.state.items() if st == RUNNING]

    def _covers(self, ts: float) -> str | None:
        """Why the changes kept cannot say the state at ``ts`` (None: they can)."""
        if self.unknown_reason is not None:
            return self.unknown_reason
        assert self.known_since is not None
        oldest = self.changes[0][0] if len(self.changes) == self.max_changes else None
        if ts < self.known_since:
            return "the moment is before the mirror heard the engine's first batch"
        if oldest is not None and ts < oldest:
            return "the moment is older than the request changes the mirror keeps"
        return None

    def at(self, ts: float) -> dict[str, Any]:
        """``running`` and ``waiting`` at engine time ``ts`` (None with ``reason``)."""
        why = self._covers(ts)
        if why is not None:
            return {"running": None, "waiting": None, "reason": why}
        running, waiting = self.running, self.waiting
        times = [c[0] for c in self.changes]
        for _, _, before, after, _ in list(self.changes)[bisect.bisect_right(times, ts) :]:
            running -= (after == RUNNING) - (before == RUNNING)
            waiting -= (after == WAITING) - (before == WAITING)
        return {"running": running, "waiting": waiting, "reason": None}

    def between(self, t0: float, t1: float, limit: int) -> dict[str, Any]:
        """The requests first scheduled and the requests ended in (t0, t1]
        (``started``/``ended`` None with ``reason``: not known).  Events, not
        a difference of two sets: a request that came and went in between is
        in both (a resumed preemption starts nothing)."""
        why = self._covers(t0)
        if why is not None:
            return {"started": None, "ended": None, "reason": why}
        started: list[str] = []
        ended: list[str] = []
        for ts, rid, _, after, first in self.changes:
            if ts <= t0 or ts > t1:
                continue
            if first:
                started.append(rid)
            elif after is None:
                ended.append(rid)
        return {"started": started[:limit], "ended": ended[:limit], "reason": None}
