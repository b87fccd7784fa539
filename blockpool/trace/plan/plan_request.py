"""What a capacity plan is asked (blockpool/trace/plan/capacity_plan.py):
the pool's KV layout (:class:`LayoutRequest`) and the plan's sizes, policies
and target (:class:`PlanRequest`), each planner field a flag of ``blockpool
trace`` (its metadata: :func:`flag`); the policies asked, parsed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blockpool.core.free_order import FreeOrder
from blockpool.trace.plan.planner import POLICIES
from blockpool.trace.plan.report import DEFAULT_FREE_ORDER
from blockpool.trace.sched.timed import TimedConfig
from blockpool.trace.sizing.capacity import (
    KVCacheDtype,
    KVLayout,
    flat_bytes,
    groups_only,
    parse_kv_cache_groups,
)
from blockpool.trace.sizing.model_config import read_model_config


def flag(text: str, metavar: str | None = None) -> dict[str, Any]:
    """A request field's flag: its help, the placeholder its help shows
    (type, default and choices come from the field)."""
    return {"help": text, "metavar": metavar}


@dataclass(frozen=True)
class LayoutRequest:
    """The pool's KV layout: a Hugging Face ``config.json`` (``model_config``)
    as vLLM reads it, or bytes a token (``bytes_per_token``) and/or the
    KV-cache groups by name (``kv_cache_groups``: ``full,sliding:4096x3``);
    nothing: sizes in tokens and blocks only.  Each field is a flag of
    ``blockpool trace`` (its metadata: :func:`flag`)."""

    model_config: str | None = field(
        default=None,
        metadata=flag(
            "a Hugging Face config.json: layers, KV heads, head size, MLA", "CONFIG_JSON"
        ),
    )
    bytes_per_token: int | None = field(
        default=None,
        metadata=flag("KV bytes per token on one GPU, all layers (instead of a model)", "N"),
    )
    kv_cache_dtype: KVCacheDtype = field(
        default="auto",
        metadata=flag("KV cache element type, as vLLM's flag (default auto: the model's)"),
    )
    tensor_parallel_size: int = field(
        default=1, metadata=flag("GPUs sharing the KV heads (default 1)", "TP")
    )
    disable_hybrid_kv_cache_manager: bool = field(
        default=False,
        metadata=flag(
            "as vLLM's flag: sliding-window layers beside full ones become full attention"
        ),
    )
    disable_sliding_window: bool = field(
        default=False,
        metadata=flag(
            "as vLLM's flag: every layer full attention (max_model_len capped at the window)"
        ),
    )
    kv_cache_groups: str | None = field(
        default=None,
        metadata=flag(
            "the KV-cache groups without a model config: comma list of full and "
            "sliding:WINDOW, each with an optional xCOUNT (full,sliding:4096x3); with "
            "--bytes-per-token N, N is a token's bytes in one group",
            "SPEC",
        ),
    )

    def layout(self) -> KVLayout | None:
        """The layout asked for (ValueError naming the flag when the request
        contradicts itself)."""
        if self.model_config and self.bytes_per_token is not None:
            raise ValueError("give --model-config or --bytes-per-token, not both")
        groups = self.kv_cache_groups
        if self.model_config:
            if groups is not None:
                raise ValueError("--kv-cache-groups is for runs without --model-config")
            return read_model_config(
                self.model_config,
                self.kv_cache_dtype,
                self.tensor_parallel_size,
                disable_sliding_window=self.disable_sliding_window,
                disable_hybrid_kv_cache_manager=self.disable_hybrid_kv_cache_manager,
            )
        for flag in ("disable_sliding_window", "disable_hybrid_kv_cache_manager"):
            if getattr(self, flag):
                raise ValueError(
                    f"--{flag.replace('_', '-')} acts on a --model-config's layers "
                    "(without one, name the groups: --kv-cache-groups full)"
                )
        attention = () if groups is None else parse_kv_cache_groups(groups)
        if self.bytes_per_token is not None:
            return flat_bytes(self.bytes_per_token, attention)
        return None if groups is None else groups_only(attention)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.  Sizes: ``capacity`` (a comma list: bytes with a unit,
    tokens as a bare number, ``inf``), ``capacity_tokens`` and
    ``capacity_blocks`` (comma lists of tokens and of num_gpu_blocks,
    whatever the groups; ``inf``); none: one pool that never evicts.
    ``policies``: a comma list beside the replay's LRU
    (:data:`~blockpool.trace.plan.planner.POLICIES` or ``none``).
    ``timed``: timed mode's scheduler (its groups come from the layout).
    The planner's own flags are fields with :func:`flag` metadata; the
    others are the replay's (``blockpool trace``'s general flags)."""

    layout: LayoutRequest = field(default_factory=LayoutRequest)
    mode: str = "sequence"
    block_size: int = 16
    capacity: str | None = field(
        default=None,
        metadata=flag(
            "comma list of pool sizes: bytes per GPU with a unit (8GiB, 500MB, 1.5TB; "
            "needs --model-config or --bytes-per-token), tokens as a bare number, or 'inf'",
            "LIST",
        ),
    )
    capacity_tokens: str | None = None
    capacity_blocks: str | None = None
    policies: str = field(
        default="optimal",
        metadata=flag(
            f"beside the replay's own LRU: {', '.join(POLICIES)} or none "
            "(sequence mode; default optimal)",
            "LIST",
        ),
    )
    sweep: bool = field(
        default=False,
        metadata=flag(
            "a dense log-spaced curve (between the --capacity extremes, or "
            "from the smallest pool refusing nothing to one that never evicts)"
        ),
    )
    sweep_points: int = field(
        default=32, metadata=flag("capacities in a --sweep (default 32)", "N")
    )
    target_hit_rate: float | None = field(
        default=None,
        metadata=flag("also answer the smallest pool whose hit rate reaches RATE (0-1)", "RATE"),
    )
    hash_name: str = "sha256"
    free_order: FreeOrder = DEFAULT_FREE_ORDER
    one_pass: bool | None = None
    timed: TimedConfig | None = None


def parse_policies(text: str, mode: str) -> list[str]:
    names = [p.strip().lower() for p in text.split(",") if p.strip()]
    if names == ["none"]:
        return []
    for n in names:
        if n not in POLICIES and n != "lru":
            raise ValueError(f"unknown policy {n!r} in --policies (known: {', '.join(POLICIES)})")
    names = [n for n in names if n != "lru"]
    if names and mode != "sequence":
        if text == "optimal":
            return []  # the default: only where it is a bound
        raise ValueError("--policies compare eviction policies in sequence mode only")
    return list(dict.fromkeys(names))
