"""The engine's requests as the mirror heard of them (a bounded book).

Hashes and lengths only: the engine sends no token ids.  The book keeps the
last ``capacity`` requests; each record says when it arrived, its prompt
length and block count, its prefix hit when first scheduled, its
preemptions and when it finished, and those moments in order (``steps``,
each with the engine's batch number: a request's story on a mirror).
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


class RequestBook:
    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.requests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.bad = 0
        # the prompt's hashes whole until its first scheduling classifies it
        self.raw: OrderedDict[str, list[bytes]] = OrderedDict()

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
                self.requests.popitem(last=False)
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
                    self.raw.popitem(last=False)
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
