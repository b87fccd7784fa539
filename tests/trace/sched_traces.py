"""Seeded Mooncake-style traces for the scheduler tests: shared prefixes of a
few ids, private tails, output lengths up to 60, priorities 0..3."""

from __future__ import annotations

import json
import random
from pathlib import Path

from blockpool.trace import read_trace
from blockpool.trace.workload.reader import Trace

TOKENS_PER_ID = 64


def make_rows(seed: int, n: int, max_ids: int = 40, gap_ms: float = 25.0) -> list[str]:
    rng = random.Random(seed)
    t = 0.0
    lines = []
    for i in range(n):
        t += rng.expovariate(1 / gap_ms)
        nid = rng.randint(1, max_ids)
        length = (nid - 1) * TOKENS_PER_ID + rng.randint(1, TOKENS_PER_ID)
        base = rng.choice([0, 100, 200, 300])
        shared = rng.randint(0, 6)
        ids = [base + k if k < shared else 1000 + i * 50 + k for k in range(nid)]
        row = {
            "timestamp": round(t, 3),
            "input_length": length,
            "output_length": rng.randint(1, 60),
            "hash_ids": ids,
            "priority": rng.randint(0, 3),
        }
        lines.append(json.dumps(row))
    return lines


def write_trace(path: Path, seed: int, n: int, **kw: float) -> Trace:
    path.write_text("\n".join(make_rows(seed, n, **kw)) + "\n")  # type: ignore[arg-type]
    return read_trace(path, TOKENS_PER_ID)
