"""A fleet of observed KV-event streams: one ``Source`` (``source.py``) per
instance / rank, and the fleet-wide prefix views.

The fleet answers the question a KV-aware router asks (llm-d's scorer,
Dynamo's indexer): for a prompt's block hashes or tokens, how many leading
blocks does each instance hold?
"""

from __future__ import annotations

import time
from typing import Any

import zmq.asyncio

from app.observer.source import Source
from blockpool.kvevents.hashes import Hash, hash_hex

CANNOT_KNOW = (
    "block ids: events name content (hashes), never the physical block that holds it",
    "reference counts: which cached blocks running requests still use, and how many",
    "free vs used: the pool's size, its free count and usage are not in the stream",
    "the free (LRU) queue's order: which cached block is evicted next",
    "partial blocks and blocks not (yet) cached: only full, hashed blocks are announced",
    "anything before the first batch seen, unless a replay from seq 0 covers it",
    "batches lost in a gap the replay buffer no longer holds (the pool is then marked inexact)",
    "a restart whose first batches were all missed (the seq must go back for it to show)",
)


def _chain_across(sources: list[Source], h: Hash) -> tuple[list[Hash], bool]:
    """``h`` and its ancestors (parent links from any instance), root first;
    False when the chain stops at a block no instance holds (its prefix is
    then known only from there on)."""
    chain: list[Hash] = []
    seen: set[Hash] = set()
    cur: Hash | None = h
    complete = True
    while cur is not None and cur not in seen:
        seen.add(cur)
        entry = next((s.state.entries[cur] for s in sources if cur in s.state.entries), None)
        if entry is None:
            complete = False
            if not chain:
                chain.append(cur)
            break
        chain.append(cur)
        cur = entry.parent
    chain.reverse()
    return chain, complete


class Fleet:
    """Every observed source, and the fleet-wide prefix views."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources: dict[str, Source] = {s.name: s for s in sources}
        self.ctx: zmq.asyncio.Context | None = None
        self.started_at = time.time()

    async def start(self) -> None:
        self.ctx = zmq.asyncio.Context()
        for s in self.sources.values():
            s.start(self.ctx)

    async def stop(self) -> None:
        for s in self.sources.values():
            await s.stop()
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None

    def get(self, name: str) -> Source | None:
        return self.sources.get(name)

    def lookup(
        self, hashes: list[Hash] | None = None, tokens: list[int] | None = None,
        block_size: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Per instance, the leading blocks held of a request given as its
        block hashes (several: the request's hashes in order; one: that
        block's whole prefix, from the parent links) or its tokens."""
        sources = list(self.sources.values())
        query: dict[str, Any]
        rows: list[dict[str, Any]] = []
        if hashes is not None:
            complete = True
            if len(hashes) == 1:
                chain, complete = _chain_across(sources, hashes[0])
            else:
                chain = hashes
            query = {
                "kind": "hashes",
                "hashes": [hash_hex(h) for h in chain],
                "chain_complete": complete,
                "blocks": len(chain),
            }
            for s in sources:
                lead = s.state.leading(chain)
                held = sum(1 for h in chain if h in s.state.entries)
                size = s.state.block_size or 0
                rows.append(_row(s, lead, held, lead * size))
        else:
            toks = tokens or []
            query = {"kind": "tokens", "num_tokens": len(toks), "block_size": block_size}
            for s in sources:
                found = s.state.match_tokens(toks, block_size)
                size = block_size or s.state.block_size or 0
                row = _row(s, len(found), len(found), len(found) * size)
                row["hashes"] = [hash_hex(h) for h in found]
                rows.append(row)
        rows.sort(key=lambda r: (-r["leading_blocks"], r["instance"]))
        best = rows[0]["leading_blocks"] if rows else 0
        return {
            "query": query,
            "best": [r["instance"] for r in rows if r["leading_blocks"] == best and best > 0],
            "instances": rows,
        }

    def overview(self, limit: int = 50) -> dict[str, Any]:
        """Which instances hold which prefixes: the held blocks grouped by
        their root (first block) -- one row per prefix family, with each
        instance's block count and deepest chain under it."""
        families: dict[Hash, dict[str, Any]] = {}
        for s in self.sources.values():
            entries = s.state.entries
            for h, (root, depth) in s.state.depths().items():
                fam = families.get(root)
                if fam is None:
                    first = entries.get(root)
                    fam = families[root] = {
                        "root": root,
                        "tokens": list(first.tokens[:16]) if first is not None else [],
                        "lora_name": first.lora_name if first is not None else None,
                        "per": {},
                    }
                per = fam["per"].setdefault(s.name, {"blocks": 0, "depth": 0})
                per["blocks"] += entries[h].copies
                if depth > per["depth"]:
                    per["depth"] = depth
        rows = []
        for fam in families.values():
            per = fam["per"]
            rows.append(
                {
                    "root": hash_hex(fam["root"]),
                    "first_tokens": fam["tokens"],
                    "lora_name": fam["lora_name"],
                    "num_instances": len(per),
                    "blocks": sum(p["blocks"] for p in per.values()),
                    "max_depth": max(p["depth"] for p in per.values()),
                    "instances": [
                        {"instance": name, "blocks": p["blocks"], "depth": p["depth"]}
                        for name, p in sorted(per.items(), key=lambda kv: -kv[1]["depth"])
                    ],
                }
            )
        rows.sort(key=lambda r: (-r["num_instances"], -r["max_depth"], -r["blocks"], r["root"]))
        return {
            "families": len(rows),
            "limit": limit,
            "instances": list(self.sources),
            "items": rows[:limit],
        }


def _row(s: Source, lead: int, held: int, tokens: int) -> dict[str, Any]:
    return {
        "instance": s.name,
        "leading_blocks": lead,
        "leading_tokens": tokens,
        "held_blocks": held,
        "exact": s.exact(time.time()),
        "connected": s.connected,
    }
