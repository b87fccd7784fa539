"""The engine's requests as the mirror heard of them (a bounded book).

Hashes and lengths only: the engine sends no token ids.  The book keeps the
last ``capacity`` requests; each record says when it arrived, its prompt
length and block count, its prefix hit when first scheduled, its
preemptions and when it finished, and those moments in order (``steps``,
each with the engine's batch number: a request's story on a mirror).

Bounded twice: ``capacity`` requests, and ``max_bytes`` over what they hold
(their hashes, kept raw until classified and as text for the views, their
steps): a stream of records with the largest hashes the protocol admits
cannot grow it past the budget, the oldest requests go first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from blockpool.mirror.protocol import (
    REQ_ARRIVE,
    REQ_FINISHED,
    REQ_PREEMPTED,
    REQ_SCHEDULED,
    Arrive,
    Preempted,
    Record,
    Scheduled,
)

MAX_STEPS = 64  # per request: arrival, scheduling, preemptions, finish
MAX_BYTES = 64 * 1024 * 1024  # the book's budget (see the module doc)
# what Python spends on each thing kept (CPython, 64-bit), rounded up
REQUEST_BYTES = 1024  # the record's dict, its id, its lists
STEP_BYTES = 400  # one step's dict
RAW_HASH_BYTES = 33 + 8  # a bytes object and its list slot
TEXT_HASH_BYTES = 49 + 16 + 8  # its 16 hex characters, a str object, its list slot


def _raw_cost(hashes: list[bytes]) -> int:
    return sum(len(h) for h in hashes) + RAW_HASH_BYTES * len(hashes)


class RequestBook:
    def __init__(self, capacity: int = 10_000, max_bytes: int = MAX_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.requests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.bad = 0
        # the prompt's hashes whole until its first scheduling classifies it
        self.raw: OrderedDict[str, list[bytes]] = OrderedDict()
        self.bytes = 0  # what the requests kept hold (their raw hashes counted while kept)
        self.dropped = 0  # requests let go to keep within the budget
        self._cost: dict[str, int] = {}

    def _charge(self, rid: str, cost: int) -> None:
        """``rid`` holds ``cost`` bytes now; the oldest requests go while over budget."""
        self.bytes += cost - self._cost.get(rid, 0)
        self._cost[rid] = cost
        while self.bytes > self.max_bytes and self.requests:
            self._forget(next(iter(self.requests)))

    def _forget(self, rid: str) -> None:
        self.requests.pop(rid, None)
        self.raw.pop(rid, None)
        self.bytes -= self._cost.pop(rid, 0)
        self.dropped += 1

    def _cost_of(self, rid: str, r: dict[str, Any]) -> int:
        raw = self.raw.get(rid)
        return (
            REQUEST_BYTES
            + len(rid)
            + TEXT_HASH_BYTES * len(r["block_hashes"])
            + STEP_BYTES * len(r["steps"])
            + (_raw_cost(raw) if raw is not None else 0)
        )

    def _get(self, rid: str, ts: float) -> dict[str, Any]:
        r = self.requests.get(rid)
        if r is None:
            r = {
                "request_id": rid,
                "arrived": ts,
                "prompt_tokens": None,
                "num_blocks": None,
                "block_hashes": [],
                "hit_tokens": None,
                "scheduled": None,
                "preemptions": 0,
                "finished": None,
                "num_tokens": None,
                "steps": [],
                "reasons": None,
                "miss_details": None,
                "skips_cache": False,
            }
            self.requests[rid] = r
            while len(self.requests) > self.capacity:
                self._forget(next(iter(self.requests)))
        return r

    def apply(self, records: list[Record], seq: int | None = None) -> list[str]:
        """Take a batch's records (decoded and validated); the requests first
        scheduled in it."""
        first: list[str] = []
        for rec in records:
            rid, ts = rec.rid, float(rec.ts)
            r = self._get(rid, ts)
            value: int | None = None
            if isinstance(rec, Arrive):
                kind = REQ_ARRIVE
                r["arrived"] = ts
                r["prompt_tokens"] = value = rec.prompt_tokens
                r["num_blocks"] = len(rec.hashes)
                r["skips_cache"] = rec.skips_cache
                raw = rec.hashes[:4096]
                r["block_hashes"] = [h[-8:].hex() for h in raw]
                self.raw[rid] = raw
                while len(self.raw) > self.capacity:
                    self.raw.popitem(last=False)  # (its request went first: charged)
            elif isinstance(rec, Scheduled):
                kind = REQ_SCHEDULED
                value = rec.hit_tokens
                if r["scheduled"] is None:
                    r["scheduled"] = ts
                    r["hit_tokens"] = rec.hit_tokens
                    first.append(rid)
            elif isinstance(rec, Preempted):
                kind = REQ_PREEMPTED
                r["preemptions"] += 1
            else:
                kind = REQ_FINISHED
                r["finished"] = ts
                r["num_tokens"] = value = rec.num_tokens
            steps = r["steps"]
            if len(steps) < MAX_STEPS:
                steps.append({"seq": seq, "ts": ts, "op": kind, "value": value})
            if rid in self.requests:  # (a record larger than the whole budget went at once)
                self._charge(rid, self._cost_of(rid, r))
        return first

    def recent(self, limit: int) -> list[dict[str, Any]]:
        out = list(self.requests.values())[-limit:]
        skip = ("block_hashes", "steps", "reasons", "miss_details")
        rows = []
        for r in reversed(out):
            row = {k: v for k, v in r.items() if k not in skip}
            reasons = r["reasons"]
            row["misses"] = None if reasons is None else _counts(reasons)
            rows.append(row)
        return rows


def _counts(reasons: list[str | None]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in reasons:
        if x is not None:
            out[x] = out.get(x, 0) + 1
    return out


LISTING_REASON = (
    "a mirror is told a request's prompt and its prefix hit, not the tokens it made "
    "since nor the blocks it holds"
)


def running_page(
    book: RequestBook, running: list[str] | None, block_size: int, offset: int, limit: int
) -> dict[str, Any]:
    """``GET /api/requests`` on a mirror: the engine's running requests
    (``running``: their ids, None where not known) as the book heard of them."""
    if running is None:
        return {"total": None, "offset": offset, "limit": limit, "items": [],
                "reason": "the engine's running requests are not known here"}  # fmt: skip
    items = []
    for rid in running[offset : offset + limit]:
        r = book.requests.get(rid)
        hit = r["hit_tokens"] if r is not None else None
        items.append(
            {
                "request_id": rid,
                "num_tokens": None,
                "num_blocks": None,
                "num_hit_blocks": None if hit is None else hit // block_size,
                "num_prompt_tokens": r["prompt_tokens"] if r is not None else None,
            }
        )
    return {
        "total": len(running),
        "offset": offset,
        "limit": limit,
        "items": items,
        "reason": LISTING_REASON,
    }
