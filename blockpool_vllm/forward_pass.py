"""The engine's forward passes, as the plugin's thread plans its work in them.

The plugin's thread reads vLLM's pool only while the engine's thread does
not need the interpreter: in its forward pass (the scheduler handed a step
to the model: ``begins`` .. ``ends``, called by blockpool_vllm's scheduler
hooks on the engine's thread, one clock read each), or once the engine has
been idle a while.  ``ForwardPasses`` is what both threads share about that:
whether a pass runs, how long the last ones were, and the plan for the one
running -- the moment by which the plugin's thread begins no more work
(``deadline``: 85 % of the shortest of the last ``KEPT`` passes), so that
it is blocked, not holding the interpreter, when the engine comes back.
It also paces that thread (blockpool_vllm/pacing.py), and wakes it for a
pass only as often as it needs (``WAKE_EVERY_NS``).

A *pipelined* engine (vLLM's ``AsyncScheduler``: step N+1 is scheduled while
step N's forward pass runs, and the engine then waits for N) is planned
otherwise.  What it waits for began on the GPU when the pass before it ended
-- the engine's last wait -- not when the scheduler handed over its step, so
how long it waits is the forward pass less however long the scheduling in
between took: a step that scheduled a long prefill waits for almost nothing,
one that scheduled decodes for most of a pass (vLLM 0.32's AsyncScheduler at
524,288 blocks, 20 ms passes: waits p10 1.9 ms, p50 9.9 ms, 65 of 800 under
1 ms).  The shortest wait of the last 16 -- the plan above -- was then under
1 ms most of the time, the plugin's thread read a few blocks a step, fell
behind the engine and took no digest while it ran.  So a pipelined engine's
pass is planned to end a forward pass after the last one ended (the shortest
time between two ends the engine waited for: how long a forward pass takes,
``gaps``), and only when the engine waited for the last one (else its result
came earlier, unseen, and so may this one).

A GPU's pass takes longer the more tokens it runs: a step of 8,192 prefill
tokens several times a decode step's 256.  The shortest of the last passes
is a decode's, and a prefill's pass planned by it left most of it unused
-- the very passes whose steps name the most blocks (vLLM 0.32's
AsyncScheduler at 524,288 blocks, passes of 12 ms + 2 us a token: the
plugin's thread read in half of a wait and its digest fell behind after a
burst of prefills, for good).  So a pass is planned by the shortest of the
kept ones that ran at least half as many tokens as it and no more
(``TOKENS_FLOOR``): a pass with fewer tokens is not longer, on a GPU, than
one with more (the shortest of several: one slow pass moves nothing).  An
engine whose passes are not so -- one ended before the deadline planned so
-- is planned by the shortest of all for a while (``TOKENS_OFF_PASSES``).
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable
from time import perf_counter_ns as _now

from blockpool_vllm.pacing import Pacer

# the engine is idle once it has not flushed a step for this long: the
# plugin's thread may then work too, with no pass to plan by
IDLE_AFTER_S = 0.05
# the shortest of the last KEPT passes is what the plugin's thread counts on,
# and it begins no piece of work it expects to end after END_SHARE of it
# (what it read would be thrown away, and the engine, back, would wait for
# the interpreter).  (It keeps pausing from the start: the engine may still
# run Python a while after the pass is handed over -- vLLM's model runner
# preparing it, the bench's fake one sampling -- and a thread that never
# pauses keeps it waiting for the interpreter up to the 5 ms switch
# interval, measured.)
KEPT = 16
END_SHARE = 0.85
# passes shorter than this are no time of the plugin's thread's own: an
# engine that never waits for its forward pass (vLLM's AsyncScheduler on a
# CPU slower than its GPU: the "pass" is its own Python, ~0.4 ms measured)
# -- the thread is not woken for them (each wake takes the interpreter from
# the busy engine), it works on its own turns (blockpool_vllm/sender.py)
MIN_WINDOW_NS = 1_000_000
# the plugin's thread is woken for a forward pass at most this often while it
# has nothing left over from its last turn -- it then does the passes' work
# since in one (their batches, the digest over their blocks: a block named
# again read once) -- and for every pass while it has (``eager``).  Each wake
# costs the engine more than the work done in it (the interpreter handed to
# the thread and back; measured on the GPU-scale bench, bench.gpu_scale.ab,
# sync, 524,288 blocks, ~11.5 ms steps: the thread woken every pass with
# nothing to send or read added about as much to the engine's step as with
# its work, not woken at all less).  (Forced cadences there, 2 runs
# each: every pass +0.39/+0.40 ms step p50, 0.964x/0.973x; every 4th
# +0.25/+0.21, 0.985x/0.981x; every 8th +0.11/+0.10, 0.992x/0.987x -- part
# of it the digest reading they left undone; both modes plain +0.05/+0.16,
# 0.988x/0.983x.)  The stream is that much later at most (the mirror's
# lag); a snapshot asked for, a digest behind or batches left make the
# thread eager again.
WAKE_EVERY_NS = 80_000_000
# a pipelined engine's pass is planned by its forward passes' lengths once
# it waited for this many in a row (a pass shorter than ``MIN_WINDOW_NS``:
# its result was there before it waited, when is not known)
GAPS_KEPT = 8
# a pass is planned by the kept ones that ran from this share of its tokens
# up to as many (module doc); after one ended before a plan made so, by the
# shortest of all for this many passes
TOKENS_FLOOR = 0.5
TOKENS_ALIKE = 2  # ... once as many such are kept (one may have waited for its step)
TOKENS_OFF_PASSES = 4 * KEPT


class ForwardPasses:
    """The engine's forward passes (``windowed``: its scheduler's hooks say
    when one begins and ends; else there are none to wait for, and the
    plugin's thread may work whenever it likes)."""

    def __init__(
        self,
        windowed: bool,
        work_left: Callable[[], bool] | None = None,
        pipelined: bool = False,
    ) -> None:
        self.window = threading.Condition() if windowed else None
        self.pipelined = pipelined  # the engine waits for the step before (module doc)
        self.forwarding = False
        self.count = 0  # passes begun
        self.wakes = 0  # ... of which the plugin's thread was woken for
        self.woken_at = 0  # perf_counter_ns at the last wake
        # the plugin's thread, going to wait: it has work left (woken for every pass)
        self.eager = False
        # what else the plugin's thread has left to do (the follower's digest, a snapshot)
        self.work_left = work_left
        self._turn_seen = 0
        self.began = 0  # perf_counter_ns at the last ``begins``
        self.lengths = array("q", bytes(8 * KEPT))  # the last passes' lengths (ns), a ring
        self.lengths_tokens = array("q", bytes(8 * KEPT))  # ... the tokens each ran
        # the tokens of the pass running (pipelined: the step handed over before
        # this one's -- that pass is what the engine waits for now) and of the next
        self.tokens = 0
        self.next_tokens = 0
        # a plan by tokens for the pass running: its deadline (perf_counter_ns;
        # 0: none) -- a pass that ended before it was planned too long --, plans
        # by tokens found so, and from which pass on they are made again
        self.tokens_end = 0
        self.tokens_misses = 0
        self.tokens_from = 0
        self.long_ones = 0  # ... of which at least MIN_WINDOW_NS
        # pipelined: when the last pass ended (perf_counter_ns), whether the
        # engine waited for it then (a pass of MIN_WINDOW_NS at least), the
        # times between two such ends in a row (a forward pass: ns, a ring)
        self.ended = 0
        self.ended_waited = False
        self.gaps = array("q", bytes(8 * GAPS_KEPT))
        self.gaps_tokens = array("q", bytes(8 * GAPS_KEPT))  # ... the tokens each ran
        self.gaps_seen = 0
        self.deadline = 0  # the plugin's thread's: no work begun that would end after it
        self.planned_by_tokens = False  # the plan for the pass running was (``_shortest``)
        # the plugin's thread sleeps a moment every ~0.1 ms of work, so that an
        # engine back from its forward pass waits no longer for the interpreter
        self.pace = Pacer()
        self.last_flush = time.monotonic()  # the engine's last step (its flush)

    def begins(self, tokens: int = 0) -> None:
        """The engine's thread: the scheduler handed a step of ``tokens`` to
        the model (its forward pass runs now: the engine's thread waits for
        it, the interpreter is free)."""
        w = self.window
        if w is not None:
            now = _now()
            self.began = now
            if self.pipelined:
                self.tokens, self.next_tokens = self.next_tokens, tokens
            else:
                self.tokens = tokens
            self.tokens_end = 0
            self.forwarding = True
            self.count += 1
            if self.eager or now - self.woken_at >= WAKE_EVERY_NS:
                with w:  # (only the waiter's predicate needs the lock)
                    self.woken_at = now
                    self.wakes += 1
                    w.notify_all()

    def ends(self) -> None:
        """The engine's thread is back in the scheduler (any hook's entry)."""
        if self.forwarding:
            self.forwarding = False
            now = _now()
            length = now - self.began
            at = self.count % KEPT
            waited = length >= MIN_WINDOW_NS
            self.long_ones += waited - (self.lengths[at] >= MIN_WINDOW_NS)
            self.lengths[at] = length
            self.lengths_tokens[at] = self.tokens
            if self.pipelined:
                if waited and self.ended_waited:
                    g = self.gaps_seen % GAPS_KEPT
                    self.gaps[g] = now - self.ended
                    self.gaps_tokens[g] = self.tokens
                    self.gaps_seen += 1
                self.ended, self.ended_waited = now, waited
            if now < self.tokens_end:  # over before its deadline: not by tokens for a while
                self.tokens_misses += 1
                self.tokens_from = self.count + TOKENS_OFF_PASSES
            self.pace.until_ns = 0  # (the pass is over: no long piece of work now)

    def shortest_us(self) -> float | None:
        """The shortest of the last ``KEPT`` passes (µs): the time the
        plugin's thread plans with (about 0: an engine that never waits for
        its passes); None before so many passes, or with no hooks."""
        if self.window is None or self.count <= KEPT:
            return None
        return min(self.lengths) / 1000.0

    def windowless(self) -> bool:
        """Whether the engine's passes are too short to work in: of the last
        ``KEPT``, one shorter than ``MIN_WINDOW_NS`` -- a pipelined engine's,
        half of them (its waits vary with what it scheduled meanwhile, and
        its passes are planned by their ends: ``plan``)."""
        if self.count <= KEPT:
            return False
        if self.pipelined:
            return self.long_ones < KEPT // 2
        return self.long_ones < KEPT

    def may_work(self) -> bool:
        """Whether the plugin's thread may work on the pool now without
        taking the interpreter from the engine: its forward pass (one long
        enough to work in), or idle."""
        return (
            self.window is None
            or (self.forwarding and not self.windowless())
            or time.monotonic() - self.last_flush >= IDLE_AFTER_S
        )

    def wait_turn(self, timeout: float, queued: bool = False) -> bool:
        """The plugin's thread: wait (at most ``timeout``) for a forward pass
        it is woken for (``WAKE_EVERY_NS``: at the next one when ``queued``,
        batches waiting, or with ``work_left``), or for idleness; whether it
        may work now (the pass planned: ``deadline``)."""
        w = self.window
        if w is None:
            return True
        self.eager = queued or (self.work_left is not None and self.work_left())
        if self.windowless():
            time.sleep(timeout)  # no pass to be woken for (see MIN_WINDOW_NS)
        else:
            seen = self._turn_seen
            with w:
                w.wait_for(lambda: self.wakes != seen, timeout)
        self._turn_seen = self.wakes
        self.pace.rested()
        self.plan()
        free = self.may_work()
        self.pace.busy(not free)  # (a turn taken anyway, overdue: the engine works)
        return free

    def overdue(self) -> bool:
        """Whether the plan's deadline for the pass running has passed (no
        plan: never) -- the plugin's thread then stops what it reads, keeping
        what it read, rather than be found reading when the engine is back."""
        d = self.deadline
        return bool(d) and _now() >= d

    def plan(self) -> None:
        """The plan for the forward pass now running (see ``KEPT``): none
        until the engine has made as many passes, or while it is idle (not
        in a pass).  A pipelined engine's, once it waited for its last pass
        and ``GAPS_KEPT`` before it: ``END_SHARE`` of the time left until a
        forward pass (the shortest of the last) after the last ended -- at
        the latest when it began (a step whose scheduling outlasted it)."""
        shortest = min(self.lengths)
        if not self.forwarding or shortest <= 0:
            self.deadline = self.pace.until_ns = 0
            return
        began = self.began
        if self.pipelined and self.ended_waited and self.gaps_seen >= GAPS_KEPT:
            end = self.ended + self._shortest(self.gaps, self.gaps_tokens, min(self.gaps))
            left = end - began
            self.deadline = self.pace.until_ns = began + max(0, int(left * END_SHARE))
        else:  # (a pipelined engine's waits are its passes less what it scheduled meanwhile:
            # the shortest, with no regard to tokens)
            if self.pipelined:
                end, self.planned_by_tokens = began + shortest, False
            else:
                end = began + self._shortest(self.lengths, self.lengths_tokens, shortest)
            self.deadline = self.pace.until_ns = began + int((end - began) * END_SHARE)
        if self.planned_by_tokens:  # (a pass that ends before this: planned too long)
            self.tokens_end = self.deadline

    def _shortest(self, lengths: array[int], tokens: array[int], shortest: int) -> int:
        """How long the pass running takes at least (ns): ``shortest``, the
        shortest of ``lengths`` -- or, of those that ran from
        ``TOKENS_FLOOR`` of its tokens up to as many, the shortest, when
        longer (module doc; its ``planned_by_tokens``)."""
        self.planned_by_tokens = False
        t = self.tokens
        if t <= 0 or self.count < self.tokens_from:
            return shortest
        floor = int(t * TOKENS_FLOOR)
        alike = [n for n, k in zip(lengths, tokens, strict=True) if floor <= k <= t]
        if len(alike) < TOKENS_ALIKE or min(alike) <= shortest:
            return shortest
        self.planned_by_tokens = True
        return min(alike)
