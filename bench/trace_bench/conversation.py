"""A seeded conversation-like Mooncake trace (the shape of Mooncake's
FAST'25 ``conversation_trace.jsonl``, whose file is not in this repository):
sessions of several turns, each turn's prompt the whole conversation so far
(the previous prompt, its answer, a new message) behind one of a few shared
system prompts, sessions interleaved in time.  512 tokens per hash id, as
Mooncake's traces; the last, partial block of a prompt gets an id of its own
(the next turn extends it: a new block content).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOKENS_PER_ID = 512


def conversation_rows(seed: int, num_requests: int) -> list[str]:
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        out = list(range(next_id, next_id + n))
        next_id += n
        return out

    systems = [fresh(rng.randint(1, 6)) for _ in range(24)]
    live: list[dict[str, object]] = []
    rows: list[str] = []
    t = 0.0
    while len(rows) < num_requests:
        t += rng.expovariate(1 / 180.0)  # ms between arrivals
        if not live or (len(live) < 400 and rng.random() < 0.22):
            system = rng.choice(systems)
            live.append({"ids": list(system), "prompt": 0, "context": len(system) * TOKENS_PER_ID})
        s = rng.choice(live)
        ids: list[int] = s["ids"]  # type: ignore[assignment]
        full = s["prompt"] // TOKENS_PER_ID  # type: ignore[operator]  # the last prompt's full blocks
        if not s["prompt"]:
            full = len(ids)  # the system prompt: whole blocks
        tokens = s["context"] + rng.randint(40, 2400)  # type: ignore[operator]  # a new message
        ids = ids[:full] + fresh(-(-tokens // TOKENS_PER_ID) - full)
        out = max(1, int(rng.expovariate(1 / 340.0)))
        rows.append(json.dumps({"timestamp": int(t), "input_length": tokens,
                                "output_length": out, "hash_ids": ids}))  # fmt: skip
        # the answer joins the conversation (its blocks are new ids next turn)
        s["ids"], s["prompt"], s["context"] = ids, tokens, tokens + out
        if tokens > 120_000 or rng.random() < 0.12:  # the session ends
            live.remove(s)
    return rows


def write_conversation(path: Path, seed: int, num_requests: int) -> Path:
    path.write_text("\n".join(conversation_rows(seed, num_requests)) + "\n")
    return path


if __name__ == "__main__":
    import sys

    write_conversation(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
