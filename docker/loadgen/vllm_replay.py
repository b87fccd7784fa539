#!/usr/bin/env python3
"""Replays a Mooncake trace (JSONL: hash_ids, output_length) against a vLLM
OpenAI server started with ``--skip-tokenizer-init``: each request's prompt
is token ids, one block of ``--block-size`` ids per hash id (the same hash
id, the same ids), so that requests sharing hash ids share a prefix in the
engine's cache exactly as the trace says.  Loops over the trace.

Every ``--stats-interval`` seconds one line goes to stdout (``[vllm-replay]
sent= ok= errors= prompt_tokens= cached_tokens= ...``) and ``--heartbeat``
is touched.  ``--max-blocks`` (16) keeps each request's first hash ids
only: the shared prefixes stay, the long tails go.  Exit codes: 1 after
``--max-errors`` failed calls in a row, 3 when the server is unreachable at
start.  Standard library and httpx only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

VOCAB = 32000
MAX_LINE = 1 << 20  # bytes of one trace line


class TooManyErrors(Exception):
    pass


@dataclass
class Stats:
    sent: int = 0
    ok: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    consecutive_errors: int = 0

    def line(self, started: float) -> str:
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return (
            f"[vllm-replay] t={time.monotonic() - started:.0f}s sent={self.sent} ok={self.ok} "
            f"errors={self.errors} prompt_tokens={self.prompt_tokens} "
            f"cached_tokens={self.cached_tokens} hit_rate={hit:.3f}"
        )


def prompt(hash_ids: list[int], block: int, max_len: int) -> list[int]:
    """``block`` token ids per hash id, derived from it alone."""
    out: list[int] = []
    for h in hash_ids:
        out += [100 + (h * 7919 + j * 104729) % (VOCAB - 100) for j in range(block)]
    return out[:max_len]


def load_trace(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open("rb") as f:
        for raw in f:
            if len(raw) > MAX_LINE:
                raise SystemExit(f"{path}: a line over {MAX_LINE} bytes")
            if raw.strip():
                row = json.loads(raw)
                hash_ids = [int(h) for h in row["hash_ids"]]
                output = max(1, int(row.get("output_length", 1)))
                rows.append({"hash_ids": hash_ids, "output_length": output})
    if not rows:
        raise SystemExit(f"{path}: no request")
    return rows


async def worker(
    client: httpx.AsyncClient, args: argparse.Namespace, rows: list[dict[str, Any]],
    queue: asyncio.Queue[int], st: Stats,
) -> None:  # fmt: skip
    while True:
        i = await queue.get()
        row = rows[i % len(rows)]
        max_tokens = min(row["output_length"], args.max_tokens)
        hash_ids = row["hash_ids"][: args.max_blocks]
        tokens = prompt(hash_ids, args.block_size, args.max_model_len - max_tokens)
        body = {"model": args.model, "prompt": tokens, "max_tokens": max_tokens,
                "temperature": 0}  # fmt: skip
        st.sent += 1
        try:
            r = await client.post("/v1/completions", json=body)
            r.raise_for_status()
            usage = r.json().get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            st.ok += 1
            st.consecutive_errors = 0
            st.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            st.cached_tokens += int(details.get("cached_tokens") or 0)
        except (httpx.HTTPError, ValueError) as exc:
            st.errors += 1
            st.consecutive_errors += 1
            print(f"[vllm-replay] error: {str(exc)[:200]}", flush=True)
            if st.consecutive_errors >= args.max_errors:
                raise TooManyErrors(f"{st.consecutive_errors} failed calls in a row") from exc


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--url", default=os.environ.get("VLLM_URL", "http://127.0.0.1:8650"))
    ap.add_argument("--model", default=os.environ.get("VLLM_MODEL", "tiny"))
    ap.add_argument("--trace", type=Path, default=Path(__file__).with_name("mooncake_head50.jsonl"))
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=8)
    # each request's first hash ids only: the trace's shared prefixes kept, its
    # long tails cut, so that a small CPU engine goes round the trace quickly
    ap.add_argument(
        "--max-blocks", type=int, default=int(os.environ.get("REPLAY_MAX_BLOCKS", "16"))
    )
    ap.add_argument(
        "--concurrency", type=int, default=int(os.environ.get("REPLAY_CONCURRENCY", "2"))
    )
    ap.add_argument("--stats-interval", type=float, default=10.0)
    ap.add_argument("--heartbeat", type=Path, default=os.environ.get("REPLAY_HEARTBEAT"))
    ap.add_argument("--max-errors", type=int, default=20)
    args = ap.parse_args()
    rows = load_trace(args.trace)
    st, started = Stats(), time.monotonic()
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=args.concurrency)
    async with httpx.AsyncClient(base_url=args.url, timeout=120) as client:
        try:
            (await client.get("/v1/models")).raise_for_status()
        except httpx.HTTPError as exc:
            print(f"[vllm-replay] {args.url} unreachable: {exc}", flush=True)
            return 3
        tasks = [asyncio.create_task(worker(client, args, rows, queue, st))
                 for _ in range(args.concurrency)]  # fmt: skip
        next_stats, i = time.monotonic() + args.stats_interval, 0
        while True:
            put = asyncio.create_task(queue.put(i))
            done, _ = await asyncio.wait([put, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                if t in done:
                    put.cancel()
                    exc = t.exception()
                    return (
                        exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
                    )
            await put
            i += 1
            if time.monotonic() >= next_stats:
                print(st.line(started), flush=True)
                if args.heartbeat:
                    args.heartbeat.touch()
                next_stats = time.monotonic() + args.stats_interval


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
