"""The target search against every size, progress off a terminal, the
header's elapsed time, and the plot's axes."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from app.cli import main
from app.trace.planner import Progress
from blockpool.core.free_order import APPEND_ALL, FREE_ORDERS, UNCACHED_FIRST
from blockpool.trace import OnePassCurve, Trace, read_trace
from blockpool.trace.plan.planner import smallest_capacity, sweep_range
from blockpool.trace.replay.optimal import OptimalCurve
from tests.trace.sched_traces import TOKENS_PER_ID, write_trace


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("t") / "trace.jsonl"
    write_trace(path, 5, 160)
    return path


@pytest.fixture(scope="module")
def trace(trace_path: Path) -> Trace:
    return read_trace(trace_path, TOKENS_PER_ID)


def first_reaching(hits: list[int], sizes: list[int], need: int) -> int | None:
    return next((b for b, h in zip(sizes, hits, strict=True) if h >= need), None)


@pytest.mark.parametrize("free_order", FREE_ORDERS)
def test_the_target_is_the_first_size_reaching_it(trace: Trace, free_order: str) -> None:
    bs = 16
    opt = OptimalCurve(trace, bs)
    lo, hi = sweep_range(opt)
    sizes = list(range(2, hi + 1))  # every pool size, one pass
    curve = OnePassCurve(trace, bs, [b * bs for b in sizes], free_order)  # type: ignore[arg-type]
    lru = [r.hit_tokens for r in curve.run()]
    best = [opt.hit_blocks(b - 1) * bs for b in sizes]
    prompt = trace.prompt_tokens
    ceiling = opt.hit_blocks(None) * bs
    # answers are pools refusing nothing (lo and up): a smaller one can hit more
    # than lo by turning the longest prompts away
    at = sizes.index(lo)
    assert max(lru[:at]) > lru[at]
    refusing_nothing = sizes[at:]
    targets = (lru[at] / prompt, 0.5 * ceiling / prompt, 0.97 * lru[-1] / prompt)
    for target in targets:
        need = math.ceil(target * prompt)
        ans = smallest_capacity(trace, bs, target, opt, free_order=free_order)  # type: ignore[arg-type]
        assert ans.floor_blocks == lo
        assert ans.lru_blocks == first_reaching(lru[at:], refusing_nothing, need), target
        assert ans.optimal_blocks == first_reaching(best[at:], refusing_nothing, need), target
        assert ans.optimal_blocks is not None and ans.lru_blocks is not None
        assert ans.optimal_blocks <= ans.lru_blocks
    assert lru[at:] == sorted(lru[at:]) and best[at:] == sorted(best[at:])  # rising


def test_progress_off_a_terminal_is_a_line_every_few_seconds() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(out, tty=False, every=5.0, clock=lambda: now[0])
    quick = progress.bar("quick", "req")
    assert quick is not None
    quick(50, 100)
    quick(100, 100)
    assert out.getvalue() == ""  # over before its first line: silent
    show = progress.bar("one pass (4 capacities)", "req")
    assert show is not None
    for done in range(1, 1001):
        now[0] = done / 10  # 10 requests a second, 100 s in all
        show(done, 1000)
    lines = out.getvalue().splitlines()
    assert len(lines) == 20  # one each 5 s, the last at the end
    assert lines[0] == (
        "one pass (4 capacities): 50/1,000 req (5%), 10.0 req/s, 5.0s elapsed, ETA 95.0s"
    )
    assert lines[-1].endswith("100.0s elapsed, done") and "1,000/1,000" in lines[-1]
    assert "\r" not in out.getvalue()


def test_the_header_and_the_json_give_the_whole_runs_time(
    trace_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["trace", str(trace_path), "--tokens-per-id", str(TOKENS_PER_ID),
            "--capacity-blocks", "200,400", "--target-hit-rate", "0.2", "--quiet"]  # fmt: skip
    assert main([*base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["free_order"] == UNCACHED_FIRST
    spent = doc["seconds"] + doc["planner_seconds"]["optimal"] + doc["planner_seconds"]["target"]
    assert doc["wall_seconds"] >= spent
    assert main([*base, "--free-order", APPEND_ALL]) == 0
    head = capsys.readouterr().out.splitlines()[1]
    assert "free order append_all (vLLM 0.16); replay " in head and ", all " in head


def test_the_plot_fits_its_axes_to_the_data(trace: Trace) -> None:
    pytest.importorskip("matplotlib")
    from app.trace.plot import _gib, curve_figure, log_ticks
    from blockpool.trace.plan import capacity_plan as planner
    from blockpool.trace.plan.report import replay_trace
    from blockpool.trace.sizing.capacity import flat_bytes, parse_capacity_list

    assert log_ticks(3.3, 100) == [5.0, 10.0, 20.0, 50.0, 100.0]
    assert [_gib(v) for v in (0.5, 1.5, 20.0, 1000.0, 2000.0)] == ["0.5", "1.5", "20", "1,000",
                                                                   "2,000"]  # fmt: skip
    assert len(log_ticks(27, 45)) >= 4  # a narrow range still gets several
    layout = flat_bytes(1 << 16)  # 64 KiB a token: 1 MiB a block of 16
    caps = parse_capacity_list("200MiB,300MiB,400MiB,600MiB", 16, layout)
    report = replay_trace(trace, capacities_tokens=[c.capacity_tokens for c in caps])
    plan = planner.Plan(caps, layout, ["optimal"])
    planner.annotate(report.results, caps)
    planner.run_policies(plan, trace, 16, report.results, Progress(None).bar)
    rates = [100 * r.hit_rate for r in report.results]
    best = [100 * r.extra["optimal_hit_rate"] for r in report.results]
    target = (min(rates) + max(rates)) / 200  # between the smallest and largest LRU rate
    planner.find_target(plan, trace, 16, target, Progress(None).bar)
    fig = curve_figure(report, plan)
    (ax,) = fig.axes
    (top,) = ax.child_axes  # the GiB axis
    y_lo, y_hi = ax.get_ylim()
    drawn = [*rates, *best, 100 * target]
    pad = max(1.0, 0.08 * (max(drawn) - min(drawn)))  # fitted: the data and a margin
    assert (y_lo, y_hi) == pytest.approx((max(0.0, min(drawn) - pad), max(drawn) + pad))
    assert y_hi < 30  # not 0-100: this trace's rates are low
    assert y_lo < 100 * target < y_hi  # the target inside
    fig.canvas.draw()
    x_lo, x_hi = ax.get_xlim()
    shown = [t.get_text() for t in top.get_xticklabels() if t.get_text()]
    assert len(shown) >= 3, shown
    per_token_gib = (1 << 16) / (1 << 30)
    for text in shown:  # GiB values inside the plotted range
        assert x_lo * per_token_gib <= float(text.replace(",", "")) <= x_hi * per_token_gib
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) >= 3
    (star,) = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
    assert plan.target is not None and plan.target.lru_blocks is not None
    assert star.get_xdata()[0] == (plan.target.lru_blocks - 1) * 16
    import matplotlib.pyplot as plt

    plt.close(fig)
