"""What-if on a mirror: the engine's requests fed to shadow pools.

A mirror's pool only sees block operations, so the runtime's request hooks
that feed the shadows on a served pool never fire.  ``MirrorShadowFeed``
feeds them from the request records the engine's plugin sends instead:
a request's first scheduling admits it with its prompt length and the
hashes of its full prompt blocks (its ``Arrive`` record), its finish (or
preemption) frees it.  The shadows run in the engine's free order (the
handshake's ``free_order``: ``uncached_first`` for vLLM >= 0.24) at the
caller's factors.

This is ``blockpool trace``'s sequence model with the engine's timing:
prompt blocks only (blocks filled by decoding are not fed: the plugin does
not say which request they belong to), each request held from its first
scheduling to its finish.  Fed requests one at a time, the shadows answer
as the planner does on the same requests (tests/mirror/test_mirror_whatif.py).

Not fed, and counted: a request that skips the prefix cache
(``prompt_logprobs``: the engine neither looks it up nor counts it), one
first scheduled before the feed began or whose arrival was never heard
(its query is in the engine's counters but not in the shadows').

``feeder`` is a ``ShadowFeeder`` (inline, or one feeding a worker
process); the feed only calls ``admit``, ``finish`` and ``restart``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Protocol

from blockpool.mirror.protocol import Arrive, Finished, Preempted, Record, Scheduled

MAX_WAITING = 100_000  # requests heard arriving, not yet scheduled (the oldest go)
MAX_RUNNING = 100_000  # requests fed, not yet finished (the oldest are freed)


class ShadowSink(Protocol):
    """What the feed calls on its feeder (a ``ShadowFeeder``)."""

    def admit(self, rid: str, num_tokens: int, hashes: list[bytes]) -> None: ...

    def finish(self, rid: str) -> None: ...

    def restart(self, real: tuple[int, int]) -> None: ...


class MirrorShadowFeed:
    def __init__(
        self,
        feeder: ShadowSink,
        free_order: str,
        engine: str | None = None,
        max_held: int = MAX_WAITING,
    ) -> None:
        self.feeder = feeder
        self.free_order = free_order
        self.engine = engine  # e.g. "vLLM 0.32.0"
        self.max_held = max_held
        # rid -> (prompt tokens, hashes, skips the cache)
        self.waiting: OrderedDict[str, tuple[int, list[bytes], bool]] = OrderedDict()
        self.running: OrderedDict[str, None] = OrderedDict()
        self.started = False
        self.fed = 0  # requests admitted to the shadows
        self.finished = 0
        self.skips_cache = 0
        self.not_heard = 0  # first scheduled without an arrival heard (or before the feed)
        self.forgotten = 0  # let go to stay within max_held

    def begin(self, stats: tuple[int, int, int]) -> None:
        """The engine idle with these prefix-cache totals (its beat): the
        feed starts here if it has not (every later request is new)."""
        if not self.started:
            self.started = True
            self.feeder.restart((stats[1], stats[2]))

    def apply(
        self, records: Iterable[Record], stats: tuple[int, int, int], seq: int | None = None
    ) -> None:
        """One batch's request records, in order; ``stats``: the engine's
        prefix-cache totals after it (requests, queries, hits); ``seq`` its
        number.  Unless a beat began it, the first batch heard starts the
        feed: the shadows' span is compared with the engine's counters
        since then (since zero from the engine's very first batch)."""
        first = not self.started
        if first:
            self.started = True
            if seq == 1:  # the engine's first: nothing came before it
                first = False
                self.feeder.restart((0, 0))
            else:
                self.feeder.restart((stats[1], stats[2]))
        waiting, running = self.waiting, self.running
        for rec in records:
            rid = rec.rid
            if isinstance(rec, Arrive):
                waiting[rid] = (int(rec.prompt_tokens), list(rec.hashes), rec.skips_cache)
                while len(waiting) > self.max_held:
                    waiting.popitem(last=False)
                    self.forgotten += 1
            elif isinstance(rec, Scheduled):
                held = waiting.pop(rid, None)
                if held is None:
                    if rid not in running:  # (a resumed request is not scheduled anew)
                        self.not_heard += 1
                    continue
                prompt, hashes, skips = held
                if first:  # its query is already in the engine's counters at the start
                    self.not_heard += 1
                elif skips:
                    self.skips_cache += 1
                elif prompt > 0:
                    self.feeder.admit(rid, prompt, hashes)
                    running[rid] = None
                    self.fed += 1
                    while len(running) > self.max_held:
                        old, _ = running.popitem(last=False)
                        self.feeder.finish(old)
                        self.forgotten += 1
            elif isinstance(rec, Finished | Preempted):
                if isinstance(rec, Finished):
                    waiting.pop(rid, None)  # (finished before its first scheduling)
                if rid in running:
                    del running[rid]
                    self.feeder.finish(rid)
                    self.finished += 1

    def fed_text(self) -> str:
        return f"fed from {self.fed} mirrored requests' hash chains, free order {self.free_order}"

    def describe(self) -> dict[str, Any]:
        """How the shadows were fed (the panel and REST say it)."""
        return {
            "source": "mirror",
            "text": self.fed_text(),
            "free_order": self.free_order,
            "engine": self.engine,
            "requests_fed": self.fed,
            "requests_finished": self.finished,
            "running": len(self.running),
            "not_fed": {
                "skips_cache": self.skips_cache,
                "not_heard": self.not_heard,
                "forgotten": self.forgotten,
            },
            "blocks": "prompt blocks only (decode blocks are not fed)",
        }
