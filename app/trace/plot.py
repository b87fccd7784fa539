"""``blockpool trace --plot curve.png``: the hit-rate curve as a picture.

LRU (the replay), the offline optimum and the other policies asked for,
against the pool's usable tokens (bottom axis, log) and its memory per GPU
(top axis, when a model or ``--bytes-per-token`` gives one), with the
unbounded ceiling as a line.  matplotlib is the ``plot`` extra
(``pip install 'blockpool[plot]'``), imported only here.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from app.trace.planner import GIB
from blockpool.core.free_order import UNCACHED_FIRST
from blockpool.trace.plan.capacity_plan import Plan
from blockpool.trace.plan.pool_sizes import usable_tokens_of
from blockpool.trace.plan.report import TraceReport, free_order_label
from blockpool.trace.replay.sequence_groups import name_groups

NO_PLOT_OPTIMUM = (
    "no optimal bound over sliding-window groups: a window's hit changes which blocks "
    "a request references (optimal_reason in --json)"
)
_STYLE = {
    "lru": ("LRU", "#1f77b4", "o"),  # named with the replay's free order
    "optimal": ("optimal (offline MIN)", "#2ca02c", "s"),
    "s3fifo": ("S3-FIFO", "#ff7f0e", "^"),
    UNCACHED_FIRST: ("uncached first (shadow policy)", "#9467bd", "v"),
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
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


_MANTISSAS = (
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 2.0, 3.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0),
    (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0),
)


def log_ticks(lo: float, hi: float, least: int = 4, most: int = 8) -> list[float]:
    """Round values inside ``lo .. hi`` for a log axis: powers of ten, else 1-2-5,
    1-2-3-5, 1-1.5-2-3-4-5-6-8, then steps of a half -- the first of these
    with at least ``least`` values (thinned evenly to ``most``)."""
    if not (0 < lo <= hi) or not math.isfinite(hi):
        return []
    out: list[float] = []
    for mantissas in _MANTISSAS:
        out = []
        for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
            for m in mantissas:
                v = float(f"{m * 10.0**e:.6g}")
                if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9):
                    out.append(v)
        if len(out) >= least:
            break
    if len(out) > most:
        step = (len(out) - 1) / (most - 1)
        out = [out[round(i * step)] for i in range(most)]
    return sorted(set(out))


def y_range(values: list[float], margin: float = 0.08) -> tuple[float, float]:
    """The y axis (percent) around ``values``: their span and a margin (at
    least one point each side), kept within 0 .. 100."""
    lo, hi = min(values), max(values)
    pad = max(1.0, (hi - lo) * margin)
    return max(0.0, lo - pad), min(100.0, hi + pad)


def curve_figure(report: TraceReport, plan: Plan, title: str = "") -> Any:
    """The curve as a matplotlib figure (LRU, the policies asked for, the
    ceiling, the target): y fitted to what is drawn, x ticked in tokens
    (bottom) and, with a layout, in GiB per GPU (top)."""
    rows = [r for r in report.results if r.blocks is not None]
    if not rows:
        raise ValueError("--plot needs at least one finite capacity")
    plt = _matplotlib()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    rows.sort(key=lambda r: r.blocks or 0)
    xs = [max(1, r.extra.get("usable_tokens") or 1) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    lru = f"LRU ({free_order_label(report.free_order)})"
    series = [("lru", [100 * r.hit_rate for r in rows])]
    for pol in plan.policies:
        key = f"{pol}_hit_rate"
        if all(key in r.extra for r in rows):
            series.append((pol, [100 * r.extra[key] for r in rows]))
    for name, ys in series:
        label, color, marker = _STYLE.get(name, (name, None, "."))
        label = lru if name == "lru" else label
        ax.plot(xs, ys, marker=marker, markersize=3.5, linewidth=1.6, color=color, label=label)
    drawn = [y for _, ys in series for y in ys]
    x_lo, x_hi = min(xs), max(xs)
    target = plan.target
    if target is not None:
        drawn.append(100 * target.target)
        if target.lru_blocks is not None:  # where LRU reaches it: a point on the curve
            usable = max(1, usable_tokens_of(target.lru_blocks, report.block_size, plan.layout))
            x_lo, x_hi = min(x_lo, usable), max(x_hi, usable)
            ax.plot([usable], [100 * target.target], marker="*", markersize=11,
                    color="#d62728", linestyle="none",
                    label=f"LRU reaches the target: {usable:,} tokens")  # fmt: skip
    y_lo, y_hi = y_range(drawn)
    if plan.unbounded_hit_tokens is not None and rows[0].prompt_tokens:
        ceil = 100 * plan.unbounded_hit_tokens / rows[0].prompt_tokens
        where = "" if y_lo <= ceil <= y_hi else " (above the plotted range)"
        ax.axhline(ceil, color="#7f7f7f", linestyle="--", linewidth=1.2,
                   label=f"unbounded ceiling {ceil:.1f}%{where}")  # fmt: skip
    if target is not None:
        ax.axhline(100 * target.target, color="#d62728", linestyle=":", linewidth=1,
                   label=f"target {100 * target.target:.1f}%")  # fmt: skip
    ax.set_xscale("log")
    pad = (x_hi / x_lo) ** 0.04 if x_hi > x_lo else 1.25
    ax.set_xlim(x_lo / pad, x_hi * pad)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("pool size (usable tokens)")
    ax.set_ylabel("prompt tokens served from the cache (%)")
    lo_t, hi_t = ax.get_xlim()
    ax.xaxis.set_major_locator(FixedLocator(log_ticks(lo_t, hi_t)))
    ax.xaxis.set_major_formatter(FuncFormatter(_tokens))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", alpha=0.35)
    layout = plan.layout
    if layout is not None and layout.sized:
        per_token = layout.block_bytes(report.block_size) / report.block_size

        def to_gb(t: Any) -> Any:
            return t * per_token / GIB

        def to_tokens(g: Any) -> Any:
            return g * GIB / per_token

        top = ax.secondary_xaxis("top", functions=(to_gb, to_tokens))
        top.xaxis.set_major_locator(FixedLocator(log_ticks(to_gb(lo_t), to_gb(hi_t))))
        top.xaxis.set_major_formatter(FuncFormatter(_gib))
        top.xaxis.set_minor_formatter(NullFormatter())
        top.set_xlabel(f"KV cache per GPU (GiB; {layout.bytes_per_token:,} bytes a token)")
    head = f"{report.mode} replay, block size {report.block_size}"
    if plan.groups is not None:
        head += f", KV-cache groups: {name_groups(plan.groups)}"
        # the reason in the legend, where it never covers a curve
        ax.plot([], [], " ", label=textwrap.fill(NO_PLOT_OPTIMUM, 48))
    ax.legend(loc="best", fontsize=9, framealpha=0.9)
    if title:
        head = f"{title}: {head}"
    fig.suptitle(head, fontsize=10)
    fig.tight_layout()
    return fig


def plot_curve(report: TraceReport, plan: Plan, path: str, title: str = "") -> None:
    """Write the curve to ``path`` (PNG, or any format matplotlib knows by suffix)."""
    fig = curve_figure(report, plan, title)
    plt = _matplotlib()
    fig.savefig(path)
    plt.close(fig)
