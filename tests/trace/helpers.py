"""Small trace builders for the trace tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from blockpool.trace import Trace, parse_mooncake

DATA = Path(__file__).parent / "data"
HEAD50 = DATA / "mooncake_head50.jsonl"


def rows_to_lines(rows: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r) for r in rows]


def row(ts: float, ids: list[int], input_length: int, output_length: int = 1) -> dict[str, Any]:
    return {
        "timestamp": ts,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": ids,
    }


@st.composite
def traces(draw: st.DrawFn, max_requests: int = 30) -> Trace:
    """Prefix-sharing traces with small ids: repeats, prompts ending on a
    block boundary (duplicate copies), long prompts (refusals)."""
    tpi = draw(st.sampled_from([1, 2, 3, 4, 8]))
    n = draw(st.integers(1, max_requests))
    prefixes: list[list[int]] = [[]]
    next_id = 0
    rows = []
    for i in range(n):
        base = list(draw(st.sampled_from(prefixes)))
        base = base[: draw(st.integers(0, len(base)))]
        for _ in range(draw(st.integers(0 if base else 1, 4))):
            if draw(st.booleans()) or next_id == 0:
                next_id += 1
                base.append(next_id)
            else:
                base.append(draw(st.integers(0, next_id)))
        if not base:
            next_id += 1
            base = [next_id]
        prefixes.append(base)
        length = tpi * (len(base) - 1) + draw(st.integers(1, tpi))
        rows.append(row(i, base, length, draw(st.integers(0, 4))))
    return parse_mooncake(rows_to_lines(rows), tpi)
