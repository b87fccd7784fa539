"""A mirror's traffic: the engine's requests as a trace the planner reads.

``TrafficLog`` takes the request records of the engine's batches (what the
plugin sends: arrival, prompt length and block hashes, first scheduling
with its prefix hit, finish with the request's length) and keeps the
requests in arrival order, bounded by count and by bytes (the oldest go
first, counted in ``dropped``).  ``traffic_lines`` writes the finished ones
as JSON lines in the format of ``blockpool/common/traffic_format.py``:
Mooncake rows whose hash ids stand for the engine's block hashes, one id a
block, so ``blockpool trace`` replays the engine's own prefixes.

A request that skips the prefix cache (``prompt_logprobs``) is not a row:
the engine neither looks it up nor counts it; it is counted in
``skips_cache``; nor is one that finished without ever being scheduled (an
abort while it waited: ``never_scheduled``).  Still running requests are
not rows either (their output length is not known yet).
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from blockpool.common.traffic_format import REQUEST_ROW, TRAFFIC_FORMAT, TRAFFIC_VERSION
from blockpool.mirror.protocol import Arrive, Finished, Hello, Record, Scheduled

MAX_REQUESTS = 200_000
MAX_BYTES = 128 * 1024 * 1024
REQUEST_BYTES = 400  # what one request's record costs besides its hashes (CPython, rounded up)
HASH_BYTES = 33 + 8  # a bytes object and its list slot, besides its length


@dataclass
class Served:
    """One engine request as the log holds it."""

    arrived: float
    prompt_tokens: int
    hashes: list[bytes]  # the prompt's full blocks, in the engine's hash block size
    skips_cache: bool
    hit_tokens: int | None = None
    num_tokens: int | None = None  # prompt + output when it finished
    finished: float | None = None

    @property
    def output_tokens(self) -> int | None:
        if self.num_tokens is None:
            return None
        return max(0, self.num_tokens - self.prompt_tokens)


class TrafficLog:
    """The engine's requests in arrival order (a bounded book)."""

    def __init__(self, max_requests: int = MAX_REQUESTS, max_bytes: int = MAX_BYTES) -> None:
        if max_requests < 1 or max_bytes < 1:
            raise ValueError("a traffic log needs room for at least one request")
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests: OrderedDict[str, Served] = OrderedDict()
        self.bytes = 0
        self.dropped = 0  # requests let go to keep within the bounds
        self.unknown = 0  # records of a request never heard arriving
        self._cost: dict[str, int] = {}

    def apply(self, records: Iterable[Record]) -> None:
        """A batch's request records, in order."""
        reqs = self.requests
        for rec in records:
            if isinstance(rec, Arrive):
                rid = rec.rid
                if rid in reqs:
                    self._forget(rid, dropped=False)  # an id reused: the new request
                served = Served(
                    float(rec.ts), int(rec.prompt_tokens), list(rec.hashes), rec.skips_cache
                )
                reqs[rid] = served
                cost = REQUEST_BYTES + len(rid) + sum(len(h) + HASH_BYTES for h in rec.hashes)
                self._cost[rid] = cost
                self.bytes += cost
                while reqs and (len(reqs) > self.max_requests or self.bytes > self.max_bytes):
                    self._forget(next(iter(reqs)))
                continue
            r = reqs.get(rec.rid)
            if r is None:
                self.unknown += 1
            elif isinstance(rec, Scheduled):
                if r.hit_tokens is None:
                    r.hit_tokens = int(rec.hit_tokens)
            elif isinstance(rec, Finished):
                r.num_tokens = int(rec.num_tokens)
                r.finished = float(rec.ts)

    def _forget(self, rid: str, dropped: bool = True) -> None:
        self.requests.pop(rid, None)
        self.bytes -= self._cost.pop(rid, 0)
        self.dropped += dropped

    def finished(self, since: float | None = None, limit: int | None = None) -> list[Served]:
        """The finished requests that arrived at ``since`` or later, in
        arrival order; with ``limit``, the newest ``limit`` of them."""
        rows = [
            r
            for r in self.requests.values()
            if r.num_tokens is not None and (since is None or r.arrived >= since)
        ]
        return rows[-limit:] if limit is not None and limit < len(rows) else rows

    def figures(self) -> dict[str, Any]:
        held = list(self.requests.values())
        return {
            "requests": len(held),
            "finished": sum(1 for r in held if r.num_tokens is not None),
            "skips_cache": sum(1 for r in held if r.skips_cache and r.num_tokens is not None),
            "dropped": self.dropped,
            "unknown_records": self.unknown,
            "bytes": self.bytes,
            "max_requests": self.max_requests,
            "max_bytes": self.max_bytes,
        }


class HashIds:
    """Block hashes as hash ids, numbered in first-seen order; ``fresh`` an
    id no hash has (a prompt's partial last block)."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}
        self.next = 0

    def of(self, h: bytes) -> int:
        i = self.ids.get(h)
        if i is None:
            i = self.ids[h] = self.next
            self.next += 1
        return i

    def fresh(self) -> int:
        self.next += 1
        return self.next - 1


def traffic_row(r: Served, t0: float, tokens_per_id: int, ids: HashIds) -> dict[str, Any]:
    """One request as a Mooncake row (``timestamp`` in ms after ``t0``)."""
    full = r.prompt_tokens // tokens_per_id
    hash_ids = [ids.of(h) for h in r.hashes[:full]]
    # a chain shorter than the prompt's full blocks (never, from vLLM): the
    # blocks not hashed get ids of their own, as the partial last block does
    while len(hash_ids) * tokens_per_id < r.prompt_tokens:
        hash_ids.append(ids.fresh())
    return {
        "timestamp": round(max(0.0, r.arrived - t0) * 1000.0, 3),
        "input_length": r.prompt_tokens,
        "output_length": r.output_tokens or 0,
        "hash_ids": hash_ids,
        "hit_tokens": r.hit_tokens,
    }


def is_row(r: Served) -> bool:
    """Whether the engine looked the request up: scheduled, not skipping the
    prefix cache (an aborted request that never ran was never queried)."""
    return r.prompt_tokens > 0 and not r.skips_cache and r.hit_tokens is not None


def traffic_rows(
    served: list[Served], tokens_per_id: int, t0: float | None = None
) -> Iterator[dict[str, Any]]:
    """The requests that may be rows (prompt of at least one token, not
    skipping the cache) as rows, timestamps never going back."""
    if tokens_per_id < 1:
        raise ValueError("tokens per id must be positive")
    ids = HashIds()
    rows = [r for r in served if is_row(r)]
    if t0 is None:
        t0 = rows[0].arrived if rows else 0.0
    last = 0.0
    for r in rows:
        row = traffic_row(r, t0, tokens_per_id, ids)
        last = row["timestamp"] = max(last, row["timestamp"])
        yield row


def traffic_header(
    served: list[Served], tokens_per_id: int, engine: dict[str, Any] | None, log: TrafficLog
) -> dict[str, Any]:
    rows = [r for r in served if is_row(r)]
    return {
        "type": "header",
        "format": TRAFFIC_FORMAT,
        "version": TRAFFIC_VERSION,
        "tokens_per_id": tokens_per_id,
        "engine": engine,
        "requests": len(rows),
        "first_arrival": rows[0].arrived if rows else None,
        "not_rows": {
            "skips_cache": sum(1 for r in served if r.skips_cache),
            "never_scheduled": sum(1 for r in served if r.hit_tokens is None),
            "dropped_before": log.dropped,
        },
    }


def traffic_lines(
    log: TrafficLog,
    tokens_per_id: int,
    engine: dict[str, Any] | None = None,
    since: float | None = None,
    limit: int | None = None,
) -> Iterator[str]:
    """The log's finished requests as a traffic file's JSON lines (each
    ends with a newline): the header, then a row a request.  The requests
    are taken now; the lines are written as they are read."""
    served = log.finished(since, limit)
    dumps = json.dumps
    head = dumps(traffic_header(served, tokens_per_id, engine, log)) + "\n"
    rows = (dumps(row) + "\n" for row in traffic_rows(served, tokens_per_id))
    return itertools.chain((head,), rows)


def request_lines(log: TrafficLog, tokens_per_id: int, since: float) -> Iterator[str]:
    """The finished requests that arrived at ``since`` or later as a
    recording's request rows (``{"type": "request", ...}``; timestamps in ms
    after the first one's arrival).  The requests are taken now; the lines
    are written as they are read (another thread may read them)."""
    served = log.finished(since)
    return (
        json.dumps({"type": REQUEST_ROW, **row}) + "\n"
        for row in traffic_rows(served, tokens_per_id)
    )


def engine_facts(hello: Hello) -> dict[str, Any]:
    """What the engine is, from its handshake (an export's header, a
    traffic file's): ``tokens_per_id`` is its hash block size."""
    return {
        "mirror": True,
        "engine_id": hello.engine_id,
        "vllm_version": hello.vllm_version,
        "model": hello.model,
        "num_gpu_blocks": hello.num_gpu_blocks,
        "block_size": hello.block_size,
        "hash_block_size": hello.hash_block_size,
        "tokens_per_id": hello.hash_block_size,
        "hash_fn": hello.hash_fn,
        "free_order": hello.free_order,
        "groups": [[g.group_id, g.kind, g.block_size] for g in hello.groups],
        "exact": hello.exact,
        "problems": list(hello.problems),
        "started_at": hello.started_at,
    }
