"""A mirrored engine's request as a request story (``/api/requests/{id}/story``).

The same shape as the story of a request on blockpool's own pool
(app/pool/request_story.py), from what the engine's plugin publishes: arrival,
prompt length, the prompt's block hashes, the prefix hit when first
scheduled, preemptions, finish.  The engine sends no block tables and no
decode steps: a block's ``block_ids`` is the block holding its hash in the
mirrored pool now (none once it is gone); a missed block's reason is the
one its first scheduling was classified with (blockpool/analysis/engine_misses.py;
``sources.miss_reasons`` says whether it was).

A story is found by vLLM's internal id or by the id the client got back
(``by_client_id``): vLLM >= 0.11 gives each request it is handed the
client's id (per prompt: ``cmpl-X-0``) plus ``-`` and 8 hex characters,
and with ``n`` > 1 each sample is a request of its own, ``{k}_`` before
that; the story is then the first such request's, and ``engine_ids`` names
them all.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from blockpool.common.keys import key64
from blockpool.mirror.protocol import REQ_ARRIVE, REQ_FINISHED, REQ_PREEMPTED, REQ_SCHEDULED

if TYPE_CHECKING:
    from app.mirror.request_book import RequestBook
    from app.pool.engine import Engine

OPS = {
    REQ_ARRIVE: "arrive",
    REQ_SCHEDULED: "schedule",
    REQ_PREEMPTED: "preempt",
    REQ_FINISHED: "finish",
}


def _text(op: str, value: int | None) -> str:
    if op == REQ_ARRIVE:
        return f"arrived: {value} prompt tokens"
    if op == REQ_SCHEDULED:
        return f"first scheduled: {value} tokens from the prefix cache"
    if op == REQ_PREEMPTED:
        return "preempted: its blocks freed, it waits again"
    return f"finished at {value} tokens"


def by_client_id(book: RequestBook, rid: str) -> list[str]:
    """The engine's requests (oldest first) that vLLM made of the client's
    request ``rid``: ``rid`` itself where the engine told of it, else each
    ``[{k}_]{rid}[-{i}]-{8 hex}`` it did (see the module doc)."""
    if rid in book.requests:
        return [rid]
    made = re.compile(r"(?:\d+_)?" + re.escape(rid) + r"(?:-\d+)?-[0-9a-f]{8}")
    return [x for x in book.requests if made.fullmatch(x)]


def story_of(engine: Engine, book: RequestBook, rid: str) -> dict[str, Any] | None:
    """``rid``'s story, by the engine's id or the client's (None: not heard of)."""
    found = by_client_id(book, rid)
    if not found:
        return None
    told = engine_story(engine, book, book.requests[found[0]])
    told["engine_ids"] = found
    told["client_id"] = None if found == [rid] else rid
    return told


def holders(engine: Engine) -> dict[int, int]:
    """The 64-bit form of each cached hash (group 0) -> the first block holding it."""
    out: dict[int, int] = {}
    for key, blocks in engine.pool.cached_block_hash_to_block.iter_entries():
        if key[-4:] == b"\x00\x00\x00\x00" and blocks:
            out.setdefault(key64(key), blocks[0].block_id)
    return out


def engine_story(engine: Engine, book: RequestBook, r: dict[str, Any]) -> dict[str, Any]:
    bs = engine.settings.block_size
    prompt: int | None = r["prompt_tokens"]
    hit_tokens: int | None = r["hit_tokens"]
    num_hit = None if hit_tokens is None else hit_tokens // bs
    finished = r["finished"] is not None
    state = "finished" if finished else "running" if r["scheduled"] is not None else "waiting"
    n_tokens: int | None = r["num_tokens"] if finished else prompt
    held = holders(engine) if not finished else {}
    hashes: list[str] = r["block_hashes"]
    n_blocks = -(-prompt // bs) if isinstance(prompt, int) else len(hashes)
    reasons: list[str | None] | None = r["reasons"]
    details: dict[int, Any] = r["miss_details"] or {}
    misses: dict[str, int] = {}
    for x in reasons or ():
        if x is not None:
            misses[x] = misses.get(x, 0) + 1
    blocks: list[dict[str, Any]] = []
    for i in range(n_blocks):
        hx = hashes[i] if i < len(hashes) else None  # the last block may be partial (no hash)
        bid = held.get(int(hx, 16)) if hx is not None else None
        blocks.append(
            {
                "index": i,
                "kind": "prompt",
                "tokens": min(bs, prompt - i * bs) if isinstance(prompt, int) else None,
                "block_ids": None if bid is None else [bid],
                "hit": num_hit is not None and i < num_hit,
                "reason": reasons[i] if reasons and i < len(reasons) else None,
                "detail": details.get(i),
                "added_at": r["scheduled"],
                "hash": hx,
            }
        )
    timeline = [
        {
            "seq": s["seq"],
            "ts": s["ts"],
            "op": OPS.get(s["op"], s["op"]),
            "ok": True,
            "text": _text(s["op"], s["value"]),
        }
        for s in r["steps"]
    ]
    generated = (
        r["num_tokens"] - prompt if finished and isinstance(r["num_tokens"], int) and prompt else 0
    )
    return {
        "request_id": r["request_id"],
        "state": state,
        "num_prompt_tokens": prompt,
        "num_tokens": n_tokens,
        "lora_name": None,
        "cache_salt": None,
        "num_hit_blocks": num_hit,
        "hit_tokens": hit_tokens,
        "misses": misses,
        "times": {
            "first_attempt_at": r["arrived"],
            "admitted_at": r["scheduled"],
            "first_decode_at": None,
            "last_decode_at": None,
            "finished_at": r["finished"],
        },
        "admissions_refused": 0,
        "preemptions": r["preemptions"],
        "decode": {"steps": 0, "tokens": max(0, generated), "new_blocks": 0},
        "blocks": blocks,
        "timeline": timeline,
        "timeline_omitted": 0,
        "earlier_lives": 0,
        "sources": {
            "running": False,
            "miss_reasons": reasons is not None,
            "recording": None,
            "engine": True,
        },
        "limits": {
            "finished_requests_kept": book.capacity,
            "recording_max_ops": engine.settings.recording_max_ops,
        },
    }
