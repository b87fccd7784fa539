"""A realistic small trace for the fleet tests: conversations that share
system prompts, turns that extend their conversation's prompt, and one-off
requests, interleaved in time (seeded: the same trace every run)."""

from __future__ import annotations

import random

from blockpool.trace import Trace, parse_mooncake
from tests.trace.helpers import row, rows_to_lines


def conversation_trace(
    seed: int = 7,
    conversations: int = 24,
    turns: int = 5,
    system_prompts: int = 3,
    one_offs: int = 20,
    tokens_per_id: int = 16,
    gap_ms: float = 40.0,
) -> Trace:
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    systems = [fresh(rng.randint(2, 6)) for _ in range(system_prompts)]
    events: list[tuple[float, list[int], int]] = []
    for _ in range(conversations):
        ids = list(rng.choice(systems)) + fresh(rng.randint(1, 3))
        t = rng.uniform(0, gap_ms * conversations)
        for _ in range(rng.randint(2, turns)):
            ids = ids + fresh(rng.randint(1, 4))
            events.append((t, list(ids), rng.randint(1, 24)))
            t += rng.uniform(gap_ms, 6 * gap_ms)
    for _ in range(one_offs):
        ids = fresh(rng.randint(1, 8))
        events.append((rng.uniform(0, gap_ms * conversations), ids, rng.randint(1, 24)))
    events.sort(key=lambda e: e[0])
    rows = []
    for t, ids, out in events:
        length = tokens_per_id * (len(ids) - 1) + rng.randint(1, tokens_per_id)
        rows.append(row(round(t, 3), ids, length, out))
    return parse_mooncake(rows_to_lines(rows), tokens_per_id)
