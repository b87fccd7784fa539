"""``blockpool trace --plot curve.png``: the hit-rate curve as a picture.

LRU (the replay), the offline optimum and the other policies asked for,
against the pool's usable tokens (bottom axis, log) and its memory per GPU
(top axis, when a model or ``--bytes-per-token`` gives one), with the
unbounded ceiling as a line.  matplotlib is the ``plot`` extra
(``pip install 'blockpool[plot]'``), imported only here.
"""

from __future__ import annotations

import textwrap
from typing import Any

from app.trace.planner import GIB, Plan
from blockpool.core.free_order import UNCACHED_FIRST
from blockpool.trace.replay import TraceReport
from blockpool.trace.sequence_groups import name_groups

NO_PLOT_OPTIMUM = (
    "no optimal bound over sliding-window groups: a window's hit changes which blocks "
    "a request references (optimal_reason in --json)"
)
_STYLE = {
    "lru": ("LRU (vLLM 0.16)", "#1f77b4", "o"),
    "optimal": ("optimal (offline MIN)", "#2ca02c", "s"),
    "s3fifo": ("S3-FIFO", "#ff7f0e", "^"),
    UNCACHED_FIRST: ("uncached first", "#9467bd", "v"),
}


def _matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib: pip install 'blockpool[plot]' (or pip install matplotlib)"
        ) from None
    return plt


def _tokens(v: float, _pos: Any = None) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def _gib(v: float, _pos: Any = None) -> str:
    return f"{v:g}"


def plot_curve(report: TraceReport, plan: Plan, path: str, title: str = "") -> None:
    """Write the curve to ``path`` (PNG, or any format matplotlib knows by suffix)."""
    rows = [r for r in report.results if r.blocks is not None]
    if not rows:
        raise ValueError("--plot needs at least one finite capacity")
    plt = _matplotlib()
    from matplotlib.ticker import FuncFormatter

    rows.sort(key=lambda r: r.blocks or 0)
    xs = [max(1, r.extra.get("usable_tokens") or 1) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    series = [("lru", [100 * r.hit_rate for r in rows])]
    for pol in plan.policies:
        key = f"{pol}_hit_rate"
        if all(key in r.extra for r in rows):
            series.append((pol, [100 * r.extra[key] for r in rows]))
    for name, ys in series:
        label, color, marker = _STYLE.get(name, (name, None, "."))
        ax.plot(xs, ys, marker=marker, markersize=3.5, linewidth=1.6, color=color, label=label)
    if plan.unbounded_hit_tokens is not None and rows[0].prompt_tokens:
        ceil = 100 * plan.unbounded_hit_tokens / rows[0].prompt_tokens
        ax.axhline(ceil, color="#7f7f7f", linestyle="--", linewidth=1.2,
                   label=f"unbounded ceiling {ceil:.1f}%")  # fmt: skip
    if plan.target is not None:
        ax.axhline(100 * plan.target.target, color="#d62728", linestyle=":", linewidth=1,
                   label=f"target {100 * plan.target.target:.0f}%")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("pool size (usable tokens)")
    ax.set_ylabel("prompt tokens served from the cache (%)")
    ax.set_ylim(0, 100)
    ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, p: ""))
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    layout = plan.layout
    if layout is not None:
        per_token = layout.block_bytes(report.block_size) / report.block_size

        def to_gb(t: Any) -> Any:
            return t * per_token / GIB

        def to_tokens(g: Any) -> Any:
            return g * GIB / per_token

        top = ax.secondary_xaxis("top", functions=(to_gb, to_tokens))
        top.xaxis.set_major_formatter(FuncFormatter(_gib))
        top.xaxis.set_minor_formatter(FuncFormatter(lambda v, p: ""))
        top.set_xlabel(f"KV cache per GPU (GiB; {layout.bytes_per_token:,} bytes a token)")
    head = f"{report.mode} replay, block size {report.block_size}"
    if plan.groups is not None:
        head += f", KV-cache groups: {name_groups(plan.groups)}"
        # the reason in the legend, where it never covers a curve
        ax.plot([], [], " ", label=textwrap.fill(NO_PLOT_OPTIMUM, 48))
    ax.legend(loc="upper left", fontsize=9, framealpha=0.9)
    if title:
        head = f"{title}: {head}"
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
