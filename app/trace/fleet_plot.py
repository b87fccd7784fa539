"""``blockpool trace --replicas ... --plot fleet.png``: the fleet sweep as a picture.

Left: hit rate against the fleet's total KV-cache memory (GiB when a model
or ``--bytes-per-token`` gives bytes, else blocks), one line per router and
replica count; right (timed mode): TTFT p99 against the same.  The y axis
is fitted to the data, the x axis is log with its ticks labelled, and a
target is drawn inside the range with the smallest fleet meeting it marked.
matplotlib is the ``plot`` extra, imported only here (as ``app/trace/plot.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.trace.plot import _matplotlib
from blockpool.trace.fleet import FleetResult
from blockpool.trace.fleet.targets import FleetTarget

GIB = 1 << 30
_COLORS = {
    "round_robin": "#1f77b4",
    "session": "#ff7f0e",
    "prefix_aware": "#2ca02c",
    "least_loaded": "#9467bd",
}
_MARKERS = "osv^D<>p*h"


def _x(r: FleetResult, in_bytes: bool) -> float | None:
    j = r.job
    if in_bytes:
        return None if j.total_bytes is None else j.total_bytes / GIB
    return None if j.total_blocks is None else float(j.total_blocks)


def _rate(r: FleetResult) -> float | None:
    return None if r.hit_rate is None else 100 * r.hit_rate


def _ttft(r: FleetResult) -> float | None:
    return r.ttft_p99


def _fit(ax: Any, values: list[float], floor: float | None = None) -> None:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or max(abs(hi) * 0.05, 1e-3)
    lo -= pad
    if floor is not None:
        lo = max(lo, floor)
    ax.set_ylim(lo, hi + pad)


def plot_fleet(
    results: list[FleetResult], path: str, target: FleetTarget | None = None, title: str = ""
) -> None:
    rows = [r for r in results if r.job.total_blocks is not None]
    if not rows:
        raise ValueError("--plot needs at least one finite capacity")
    in_bytes = all(r.job.total_bytes is not None for r in rows)
    timed = any(r.ttft_p99 is not None for r in rows)
    plt = _matplotlib()
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, axes = plt.subplots(1, 2 if timed else 1, figsize=(13 if timed else 8, 5), dpi=120)
    axes = list(axes) if timed else [axes]
    series: dict[tuple[str, int, str], list[FleetResult]] = {}
    for r in rows:
        series.setdefault((r.job.router, r.job.replicas, r.job.free_order), []).append(r)
    orders = {k[2] for k in series}
    counts = sorted({k[1] for k in series})
    panels: list[tuple[str, Callable[[FleetResult], float | None]]] = [("hit rate (%)", _rate)]
    if timed:
        panels.append(("TTFT p99 (ms)", _ttft))
    for ax, (label, get) in zip(axes, panels, strict=True):
        ys_all: list[float] = []
        for (router, n, fo), rs in sorted(series.items()):
            pts = sorted(
                (x, y)
                for r in rs
                if (x := _x(r, in_bytes)) is not None and (y := get(r)) is not None
            )
            if not pts:
                continue
            name = f"{router} x{n}" + (f" ({fo})" if len(orders) > 1 else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=_COLORS.get(router),
                    marker=_MARKERS[counts.index(n) % len(_MARKERS)], markersize=4,
                    linewidth=1.4, label=name)  # fmt: skip
            ys_all += [p[1] for p in pts]
        want = None
        if target is not None:
            if label.startswith("hit") and target.target_hit_rate is not None:
                want = 100 * target.target_hit_rate
            elif label.startswith("TTFT") and target.target_ttft_p99_ms is not None:
                want = target.target_ttft_p99_ms
        if want is not None:
            ax.axhline(
                want, color="#d62728", linestyle=":", linewidth=1.2, label=f"target {want:g}"
            )
            ys_all.append(want)
            best = target.best if target is not None else None
            if best is not None and (bx := _x(best, in_bytes)) is not None:
                by = get(best)
                if by is not None:
                    ax.plot([bx], [by], marker="*", markersize=14, color="#d62728",
                            linestyle="none", label="smallest fleet meeting it")  # fmt: skip
        if ys_all:
            _fit(ax, ys_all, 0.0)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: ""))  # noqa: ARG005 matplotlib's formatter signature
        ax.set_xlabel(
            "fleet KV cache, all replicas (GiB)" if in_bytes else "fleet KV cache (blocks)"
        )
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.35)
        ax.legend(fontsize=8, framealpha=0.9, ncol=2 if len(series) > 8 else 1)
    head = f"fleet planning: {rows[0].mode} replay, one exact pool per replica"
    fig.suptitle(f"{title}: {head}" if title else head, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
