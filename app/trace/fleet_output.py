"""Fleet planning's output: the table, the CSV and the JSON document.

One row per configuration: replicas, capacity per replica (as asked) and in
total (GiB when a model layout gives bytes, else blocks), router, free
order, hit rate, load balance (max / mean of requests and of prompt tokens
routed per replica), evictions, refused, and in timed mode TTFT and queueing
p50/p99.  A figure not known prints ``-`` (``null`` in JSON, empty in CSV).
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict
from typing import Any

from blockpool.trace.fleet import FleetResult, FleetSpec
from blockpool.trace.fleet.targets import FleetTarget

GIB = 1 << 30
CSV_FIELDS = (
    "replicas", "capacity", "blocks_per_replica", "total_blocks", "total_gib", "router",
    "free_order", "mode", "prompt_tokens", "hit_tokens", "hit_rate", "requests_balance",
    "prompt_tokens_balance", "evictions", "refused", "preemptions", "ttft_p50_ms",
    "ttft_p99_ms", "queue_p50_ms", "queue_p99_ms",
)  # fmt: skip


def _gib(b: int | None) -> float | None:
    return None if b is None else b / GIB


def row_of(r: FleetResult) -> dict[str, Any]:
    j = r.to_json()
    t = r.ttft_ms or {}
    q = r.queue_ms or {}
    return {
        "replicas": j["replicas"],
        "capacity": j["capacity"],
        "blocks_per_replica": j["blocks_per_replica"],
        "total_blocks": j["total_blocks"],
        "total_gib": _gib(j["total_bytes"]),
        "router": j["router"],
        "free_order": j["free_order"],
        "mode": j["mode"],
        "prompt_tokens": j["prompt_tokens"],
        "hit_tokens": j["hit_tokens"],
        "hit_rate": j["hit_rate"],
        "requests_balance": j["requests_balance"],
        "prompt_tokens_balance": j["prompt_tokens_balance"],
        "evictions": j["evictions"],
        "refused": j["refused"],
        "preemptions": j["preemptions"],
        "ttft_p50_ms": t.get("p50"),
        "ttft_p99_ms": t.get("p99"),
        "queue_p50_ms": q.get("p50"),
        "queue_p99_ms": q.get("p99"),
    }


def render_csv(results: list[FleetResult]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow({k: ("" if v is None else v) for k, v in row_of(r).items()})
    return buf.getvalue()


def render_json(
    head: dict[str, Any],
    spec: FleetSpec,
    results: list[FleetResult],
    target: FleetTarget | None,
    assignments: bool = False,
) -> dict[str, Any]:
    t = spec.timed
    return {
        **head,
        "mode": spec.mode,
        "block_size": spec.block_size,
        "hash": spec.hash_name,
        "overlap_weight": spec.overlap_weight,
        "session_ids": spec.session_ids,
        "step_model": None
        if spec.mode != "timed"
        else (asdict(t.step_model) if t.step_model else {"base_ms": t.step_ms}),
        "target": None if target is None else target.to_json(),
        "results": [r.to_json(assignments) for r in results],
    }


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_table(
    head: dict[str, Any], spec: FleetSpec, results: list[FleetResult], target: FleetTarget | None
) -> str:
    lines = [
        f"trace: {head['file']} ({head['requests']} requests); fleet planning, {spec.mode} "
        f"mode, block size {spec.block_size}; {len(results)} configurations on "
        f"{head['executor']} in {head['seconds']:.2f}s",
        "each replica an exact pool of its own; balance = max/mean per replica "
        "(requests, prompt tokens); prefix_aware: cost = "
        f"{spec.overlap_weight:g} x uncached prompt blocks + load blocks",
    ]
    if "step_model_fit" in head:
        m, fit = spec.timed.step_model, head["step_model_fit"]
        lines.append(f"step model fitted from {fit['source']}: {m}")
        lines.append(
            f"  check: mean {fit['mean_tokens_per_step']:.0f} tokens a step, mean TTFT "
            f"{fit['mean_ttft_ms']:.0f} ms; the fit gives {fit['fitted_ms_at_mean']:.0f} ms there"
        )
    lines.append("")
    timed = spec.mode == "timed"
    cols = ["replicas", "capacity", "total", "router", "free_order", "hit_rate",
            "bal_req", "bal_tok", "evictions", "refused"]  # fmt: skip
    if timed:
        cols += ["ttft p50/p99 ms", "queue p50/p99 ms"]
    table = [cols]
    for r in results:
        x = row_of(r)
        total = (
            f"{x['total_gib']:.1f}GiB"
            if x["total_gib"] is not None
            else ("inf" if x["total_blocks"] is None else f"{x['total_blocks']}b")
        )
        cells = [
            str(x["replicas"]), x["capacity"], total, x["router"], x["free_order"],
            _f(x["hit_rate"], ".4f"), _f(x["requests_balance"], ".2f"),
            _f(x["prompt_tokens_balance"], ".2f"), str(x["evictions"]), str(x["refused"]),
        ]  # fmt: skip
        if timed:
            cells += [
                f"{_f(x['ttft_p50_ms'], '.0f')}/{_f(x['ttft_p99_ms'], '.0f')}",
                f"{_f(x['queue_p50_ms'], '.0f')}/{_f(x['queue_p99_ms'], '.0f')}",
            ]
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
    if target is not None:
        lines += ["", *target_lines(target)]
    return "\n".join(lines)


def _pick(r: FleetResult | None) -> str:
    if r is None:
        return "none of the swept fleets"
    j = r.job
    total = (
        f"{j.total_bytes / GIB:.1f} GiB"
        if j.total_bytes is not None
        else f"{j.total_blocks} blocks"
    )
    ttft = "" if r.ttft_p99 is None else f", TTFT p99 {r.ttft_p99:.0f} ms"
    rate = "-" if r.hit_rate is None else f"{r.hit_rate:.4f}"
    return (
        f"{j.replicas} x {j.capacity} ({total}) {j.router}, {j.free_order}: hit rate {rate}{ttft}"
    )


def target_lines(target: FleetTarget) -> list[str]:
    want = []
    if target.target_hit_rate is not None:
        want.append(f"hit rate >= {target.target_hit_rate:g}")
    if target.target_ttft_p99_ms is not None:
        want.append(f"TTFT p99 <= {target.target_ttft_p99_ms:g} ms")
    out = [f"smallest fleet with {' and '.join(want)}: {_pick(target.best)}"]
    for name, r in target.per_router.items():
        out.append(f"  {name}: {_pick(r)}")
    return out
