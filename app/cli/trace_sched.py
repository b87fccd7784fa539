"""``blockpool trace --mode timed``: the scheduler's flags, config and lines.

By default timed mode runs vLLM 0.16's v1 scheduler with vLLM's defaults
(chunked prefill, asynchronous scheduling, a budget of 8192 tokens a step,
FCFS); each feature has a flag that turns it off, and ``--scheduler simple``
turns them all off (synchronous, whole prompts, no budget).
"""

from __future__ import annotations

import argparse
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.cli.field_flags import add_field_flags, flag, from_args
from blockpool.core.attention import GroupSpec
from blockpool.trace.replay.sequence_groups import name_groups
from blockpool.trace.sched.engine_core import StepModel
from blockpool.trace.sched.group_slots import needs_groups
from blockpool.trace.sched.scheduler import Policy, SchedulerConfig
from blockpool.trace.sched.timed import TimedConfig
from blockpool.trace.sizing.capacity import KVLayout

Scheduler = Literal["vllm", "simple"]
SCHEDULERS: tuple[str, ...] = typing.get_args(Scheduler)
MAX_STEP_MODEL_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class SchedulerFlags:
    """Timed mode's scheduler flags, one a field (name, type, default, choices
    and help: ``field_flags``); ``timed_config`` reads them."""

    scheduler: Scheduler = field(
        default="vllm",
        metadata=flag(
            "vllm: vLLM 0.16's v1 scheduler (default); simple: it with every "
            "feature off (synchronous, whole prompts, no token budget)"
        ),
    )
    max_num_batched_tokens: int = field(
        default=8192, metadata=flag("tokens a step may schedule (8192; 0: no budget)", "N")
    )
    chunked_prefill: bool = field(
        default=True,
        metadata=flag(
            "a prompt runs whole or waits (vLLM's enable_chunked_prefill=False)",
            option="--no-chunked-prefill",
        ),
    )
    long_prefill_token_threshold: int = field(
        default=0, metadata=flag("at most N prompt tokens of one request a step (0: off)", "N")
    )
    max_model_len: int | None = field(
        default=None,
        metadata=flag("prompts of N tokens or more are rejected (counted), outputs stop at N", "N"),
    )
    policy: Policy = field(default="fcfs", metadata=flag("(default fcfs)"))
    async_scheduling: bool = field(
        default=True,
        metadata=flag(
            "synchronous scheduling (default: asynchronous, frees a step late)",
            option="--sync-scheduling",
        ),
    )
    step_model: str | None = field(
        default=None,
        metadata=flag(
            'JSON step times: {"base_ms", "per_prefill_token_ms", "per_decode_seq_ms"} or '
            '{"samples": [[prefill_tokens, decode_seqs, ms], ...]} to fit',
            "FILE",
        ),
    )
    step_prefill_token_ms: float = field(
        default=0.0,
        metadata=flag("ms a step adds per prefill token (0; --step-ms is the base)", "MS"),
    )
    step_decode_seq_ms: float = field(
        default=0.0, metadata=flag("ms a step adds per decoding request (0)", "MS")
    )


def add_scheduler_arguments(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("timed mode: vLLM's scheduler")
    add_field_flags(g, SchedulerFlags)


def _read_step_model(path: str) -> StepModel:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_STEP_MODEL_BYTES:
            raise ValueError(f"--step-model {path}: larger than {MAX_STEP_MODEL_BYTES} bytes")
        doc: Any = json.loads(p.read_text())
    except OSError as exc:
        raise ValueError(f"--step-model {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--step-model {path}: line {exc.lineno}: {exc.msg}") from None
    try:
        return StepModel.from_json(doc)
    except ValueError as exc:
        raise ValueError(f"--step-model {path}: {exc}") from None


def timed_config(args: argparse.Namespace, layout: KVLayout | None = None) -> TimedConfig:
    """The TimedConfig the flags ask for (ValueError naming the flag when bad);
    a ``layout`` with sliding windows or several KV-cache groups gives the
    replay its groups."""
    specs = () if layout is None else tuple(layout.group_specs(args.block_size))
    groups = specs if needs_groups(specs) else ()
    flags: SchedulerFlags = from_args(SchedulerFlags, args)
    if flags.scheduler == "simple":
        return TimedConfig(args.speed, args.step_ms, args.max_running, groups=groups)
    budget = flags.max_num_batched_tokens
    if budget < 0:
        raise ValueError("--max-num-batched-tokens must be >= 0 (0: no budget)")
    if flags.step_model:
        model = _read_step_model(flags.step_model)
    else:
        model = StepModel(args.step_ms, flags.step_prefill_token_ms, flags.step_decode_seq_ms)
    sched = SchedulerConfig(
        max_num_batched_tokens=budget or None,
        max_num_seqs=args.max_running,
        enable_chunked_prefill=flags.chunked_prefill,
        long_prefill_token_threshold=flags.long_prefill_token_threshold,
        max_model_len=flags.max_model_len,
        policy=flags.policy,
        async_scheduling=flags.async_scheduling,
    )
    return TimedConfig(args.speed, args.step_ms, args.max_running, sched, model, groups)


def _ms(d: Any) -> str:
    if not isinstance(d, dict) or d.get("p50") is None:
        return "-"
    return f"{d['p50']:.0f}/{d['p90']:.0f}/{d['p99']:.0f}"


def _group_lines(x: dict[str, Any]) -> list[str]:
    groups = x.get("kv_cache_groups")
    if not groups:
        return []
    specs = [GroupSpec(g["kind"], g["block_size"], g["sliding_window"]) for g in groups]
    return [f"KV-cache groups ({len(specs)}, one pool): {name_groups(specs)}"]


def scheduler_lines(report: Any) -> list[str]:
    """The table's lines for a replay through vLLM's scheduler (else none)."""
    rows = [r for r in report.results if "prefix_cache_queries" in r.extra]
    if not rows:
        return []
    cfg = rows[0].extra["scheduler"]
    out = [
        "",
        "scheduler: vLLM 0.16 v1 ("
        + ", ".join(f"{k}={v}" for k, v in cfg.items() if k != "step_model")
        + "), step ms = "
        + " + ".join(f"{v:g} {k}" for k, v in cfg["step_model"].items()),
        *_group_lines(rows[0].extra),
        "request_hit_rate: cached prefix at first schedule / prompt tokens (what clients see); "
        "prefix_cache_hit_rate: vLLM's /metrics prefix_cache_hits / prefix_cache_queries "
        "(every lookup, blocked retries included)",
    ]
    head = ("capacity_tokens", "request_hit_rate", "prefix_cache_hit_rate", "preemptions",
            "rejected_too_long", "ttft_ms p50/p90/p99", "queue_ms p50/p90/p99",
            "simulated_s")  # fmt: skip
    table = [head]
    for r in rows:
        x = r.extra
        # vLLM's token capacity (over groups num_gpu_blocks // groups x block size)
        tokens = x.get("kv_cache_tokens", r.capacity_tokens)
        table.append((
            "inf" if tokens is None else str(tokens),
            f"{x['request_hit_rate']:.4f}", f"{x['prefix_cache_hit_rate']:.4f}",
            str(r.preemptions), str(x["rejected_too_long"]), _ms(x["ttft_ms"]),
            _ms(x["queue_ms"]), f"{x['simulated_seconds']:.1f}",
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    out += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in table]
    return out
