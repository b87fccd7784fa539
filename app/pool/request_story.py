"""One request's story: its blocks, hits, misses with reasons, and when it
was admitted, decoded and finished -- from whatever the service still holds.

Three sources, each bounded, each said to have answered or not:

* the request manager: a running request's block tables (exact, now);
* the analysis: the reason of each missed prompt block, for running
  requests and the last ``miss_finished_kept`` finished ones;
* the recording (time travel): every operation on the request with its time
  and result -- refused admissions (it waited for blocks), the admission
  (block ids, hits), each decode step (the blocks it added), the finish
  (the blocks freed) -- while the recording holds them (``recording_max_ops``
  operations at most).

The story is of the request id's latest life: a REST client may reuse an id
after finishing it; the operations before the previous finish are left out
(``earlier_lives`` counts those lives).  The recording is scanned off the
event loop (a substring test per operation, then a decode of the few that
name the request), over copies of its columns taken between two operations.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from app.pool.views import requests as views
from app.pool.views.operator import RequestStory, StoryBlock, StoryDecode, StoryTimes
from app.shared.errors import NotFound, OperationError
from blockpool.analysis.segment import unpack

if TYPE_CHECKING:
    from app.pool.engine import Engine

Parts = list[tuple[int, list[float], list[bytes]]]  # (keyframe seq, ts, blobs) per segment


def _recording_parts(engine: Engine) -> tuple[Parts, int, int] | None:
    """Copies of the recording's columns (event loop, between operations)."""
    an = engine.analysis
    rec = an.recorder if an is not None else None
    if rec is None:
        return None
    parts = [(s.keyframe.seq, s.ts.tolist(), list(s.blobs)) for s in rec.segments]
    return parts, rec.first_seq, rec.seq


def scan(parts: Parts, rid: str) -> list[dict[str, Any]]:
    """The recorded operations on ``rid``, oldest first (any thread)."""
    needle = rid.encode()
    out: list[dict[str, Any]] = []
    for kf, ts, blobs in parts:
        for i, blob in enumerate(blobs):
            if needle not in blob:
                continue
            seq, t, op, ok, payload = unpack((kf + 1 + i, ts[i], blob, 0, 0))
            step = _step(seq, t, op, ok, payload, rid)
            if step is not None:
                out.append(step)
    return out


def _step(seq: int, ts: float, op: Any, ok: bool, payload: Any, rid: str) -> dict[str, Any] | None:
    # by the op's class name: the recording decodes into the service's or the
    # library's op models, which name their fields alike
    kind = type(op).__name__
    if kind == "AdmitOp":
        got = payload.get("request_id") if ok else (payload.get("details") or {}).get("request_id")
        if (op.request_id or got) != rid:
            return None
        step: dict[str, Any] = {"seq": seq, "ts": ts, "op": "admit", "ok": ok}
        step["tokens"] = len(op.token_ids)
        if ok:
            step.update(
                block_ids=payload["block_ids"],
                num_hit_blocks=payload["num_hit_blocks"],
                num_new_blocks=payload["num_new_blocks"],
            )
    elif kind == "AppendOp" and op.request_id == rid:
        step = {"seq": seq, "ts": ts, "op": "append", "ok": ok, "tokens": len(op.token_ids)}
        if ok:
            step.update(new_block_ids=payload["new_block_ids"], num_tokens=payload["num_tokens"])
    elif kind == "FinishOp" and op.request_id == rid:
        step = {"seq": seq, "ts": ts, "op": "finish", "ok": ok}
        if ok:
            step["freed_block_ids"] = payload["freed_block_ids"]
    else:
        return None
    if not ok:
        step["error"] = {"code": payload.get("code"), "message": payload.get("message")}
    return step


def latest_life(steps: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The steps since the last finish before the latest admission, and how
    many earlier lives (admit .. finish) came before."""
    admits = [i for i, s in enumerate(steps) if s["op"] == "admit" and s["ok"]]
    last_admit = admits[-1] if admits else len(steps)
    finishes = [i for i, s in enumerate(steps[:last_admit]) if s["op"] == "finish" and s["ok"]]
    start = finishes[-1] + 1 if finishes else 0
    return steps[start:], len(finishes)


async def story(engine: Engine, rid: str, limit: int = 200) -> RequestStory:
    s = engine.settings
    live = views.request(engine, rid).model_dump() if rid in engine.manager.requests else None
    misses: dict[str, Any] | None = None
    an = engine.analysis
    if an is not None:
        try:
            misses = await an.query("request_misses", rid=rid)
        except NotFound:
            misses = None
        except OperationError:  # the worker is down or slow: the rest still answers
            misses = None
    parts = _recording_parts(engine)
    steps: list[dict[str, Any]] = []
    earlier = 0
    if parts is not None:
        found = await asyncio.to_thread(scan, parts[0], rid)
        steps, earlier = latest_life(found)
    if live is None and misses is None and not steps:
        held = f", the recording holds op seq {parts[1]}..{parts[2]}" if parts else ""
        raise NotFound(
            f"nothing is known of request {rid!r}: not running, not among the last "
            f"{s.miss_finished_kept} finished requests{held}",
            request_id=rid,
        )
    return _assemble(engine, rid, live, misses, steps, earlier, parts, limit)


def _assemble(
    engine: Engine,
    rid: str,
    live: dict[str, Any] | None,
    misses: dict[str, Any] | None,
    steps: list[dict[str, Any]],
    earlier: int,
    parts: tuple[Parts, int, int] | None,
    limit: int,
) -> RequestStory:
    bs = engine.settings.block_size
    admit = next((x for x in steps if x["op"] == "admit" and x["ok"]), None)
    finish = next((x for x in steps if x["op"] == "finish" and x["ok"]), None)
    refused = [x for x in steps if x["op"] == "admit" and not x["ok"]]
    decodes = [x for x in steps if x["op"] == "append" and x["ok"]]
    reasons = {b["index"]: b for b in (misses or {}).get("blocks", [])}
    num_prompt = (
        live["num_prompt_tokens"]
        if live
        else misses["num_prompt_tokens"]
        if misses
        else admit["tokens"]
        if admit
        else None
    )
    num_hit = (
        live["num_hit_blocks"]
        if live
        else misses["num_hit_blocks"]
        if misses
        else admit["num_hit_blocks"]
        if admit
        else None
    )
    # block ids per index: now (running), else as the recording saw them
    tables: list[list[int]] | None = None
    added_at: dict[int, float] = {}
    if admit is not None:
        tables = [list(t) for t in admit["block_ids"]]
        for d in decodes:
            for k in range(len(d["new_block_ids"][0])):
                added_at[len(tables[0]) + k] = d["ts"]
            for g, new in enumerate(d["new_block_ids"]):
                tables[g].extend(new)
    if live is not None:
        tables = live["block_ids"]
    n_prompt_blocks = -(-num_prompt // bs) if num_prompt is not None else 0
    count = len(tables[0]) if tables else len(reasons)
    n_tokens: int | None = (
        live["num_tokens"] if live else decodes[-1]["num_tokens"] if decodes else num_prompt
    )
    blocks: list[StoryBlock] = []
    for i in range(count):
        r = reasons.get(i)
        prompt = i < n_prompt_blocks
        hit = num_hit is not None and i < num_hit
        blocks.append(
            {
                "index": i,
                "kind": "prompt" if prompt else "decode",
                "tokens": min(bs, n_tokens - i * bs) if n_tokens is not None else None,
                "block_ids": [t[i] for t in tables] if tables else None,
                "hit": hit,
                "reason": r["reason"] if r and prompt else None,
                "detail": r["detail"] if r and prompt else None,
                "added_at": added_at.get(i, admit["ts"] if admit and prompt else None),
            }
        )
    miss_counts: dict[str, int] = {}
    for b in blocks:
        why = b["reason"]
        if why is not None:
            miss_counts[why] = miss_counts.get(why, 0) + 1
    state = "running" if live else "finished" if finish or (misses and misses["finished"]) else None
    if state is None:
        state = "refused" if refused and admit is None else "finished"
    timeline = steps
    omitted = 0
    if len(steps) > limit:
        head = limit // 2
        timeline = steps[:head] + steps[len(steps) - (limit - head) :]
        omitted = len(steps) - limit
    times = StoryTimes(
        first_attempt_at=steps[0]["ts"] if steps else None,
        admitted_at=admit["ts"] if admit else (misses or {}).get("admitted_at"),
        first_decode_at=decodes[0]["ts"] if decodes else None,
        last_decode_at=decodes[-1]["ts"] if decodes else None,
        finished_at=finish["ts"] if finish else (misses or {}).get("finished_at"),
    )
    decode = StoryDecode(
        steps=len(decodes),
        tokens=sum(d["tokens"] for d in decodes),
        new_blocks=sum(len(d["new_block_ids"][0]) for d in decodes),
    )
    # model_construct: the blocks and the timeline are long, and built here
    return RequestStory.model_construct(
        request_id=rid,
        state=state,
        num_prompt_tokens=num_prompt,
        num_tokens=n_tokens,
        lora_name=(live or misses or {}).get("lora_name"),
        cache_salt=(live or misses or {}).get("cache_salt"),
        num_hit_blocks=num_hit,
        hit_tokens=num_hit * bs if num_hit is not None else None,
        misses=miss_counts,
        times=times,
        admissions_refused=len(refused),
        decode=decode,
        blocks=blocks,
        timeline=timeline,
        timeline_omitted=omitted,
        earlier_lives=earlier,
        sources={
            "running": live is not None,
            "miss_reasons": misses is not None,
            "recording": None
            if parts is None
            else {
                "first_seq": parts[1],
                "last_seq": parts[2],
                "operations_found": len(steps),
                "admission_held": admit is not None,
            },
        },
        limits={
            "finished_requests_kept": engine.settings.miss_finished_kept,
            "recording_max_ops": engine.settings.recording_max_ops,
        },
    )
