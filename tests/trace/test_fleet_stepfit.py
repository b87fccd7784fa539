"""The step model fitted from a vLLM /metrics scrape's histograms."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from blockpool.trace.fleet.stepfit import (
    MAX_SCRAPE_BYTES,
    ScrapedHistogram,
    fit_from_scrape,
    parse_histograms,
    read_scrape,
)

# vLLM's buckets (v1 metrics): tokens per step, TTFT seconds
TOKEN_BUCKETS: list[float] = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip


def histogram_text(name: str, bounds: list[float], values: list[float], engine: str) -> str:
    lines = [f"# HELP {name} x", f"# TYPE {name} histogram"]
    for b in bounds:
        n = sum(1 for v in values if v <= b)
        lines.append(f'{name}_bucket{{engine="{engine}",le="{b}",model_name="m"}} {float(n)}')
    lines.append(
        f'{name}_bucket{{engine="{engine}",le="+Inf",model_name="m"}} {float(len(values))}'
    )
    lines.append(f'{name}_sum{{engine="{engine}",model_name="m"}} {sum(values)}')
    lines.append(f'{name}_count{{engine="{engine}",model_name="m"}} {float(len(values))}')
    return "\n".join(lines)


def scrape(base_ms: float, per_token_ms: float, seed: int = 3) -> str:
    """Two engines' scrapes of steps that each prefilled one request alone:
    TTFT = base + per_token x tokens (seconds in the histogram)."""
    rng = random.Random(seed)
    parts = []
    for engine in ("0", "1"):
        tokens = [rng.uniform(64, 8000) for _ in range(4000)]
        ttft = [(base_ms + per_token_ms * t) / 1000 for t in tokens]
        parts.append(histogram_text("vllm:iteration_tokens_total", TOKEN_BUCKETS, tokens, engine))
        parts.append(histogram_text("vllm:time_to_first_token_seconds", TTFT_BUCKETS, ttft, engine))
    return "\n".join(parts) + '\nvllm:num_requests_running{engine="0"} 3.0\n'


def test_the_fit_recovers_the_step_model_within_the_buckets() -> None:
    fit = fit_from_scrape(scrape(20.0, 0.12))
    model = fit.model
    assert len(fit.pairs) == 9
    # tokens per step span 64..8000 -> TTFT 28..980 ms, through coarse buckets
    assert model.per_prefill_token_ms == pytest.approx(0.12, rel=0.1)
    assert model.per_decode_seq_ms == model.per_prefill_token_ms
    assert model.base_ms == pytest.approx(20.0, abs=15.0)
    # a slower engine fits slower: the fit follows the data
    # the exact means agree with the fit: the data follow the model
    assert fit.fitted_ms_at_mean == pytest.approx(fit.mean_ttft_ms, rel=0.05)
    slow = fit_from_scrape(scrape(20.0, 0.3)).model
    assert slow.per_prefill_token_ms > 2 * model.per_prefill_token_ms


def test_series_are_summed_and_quantiles_interpolate() -> None:
    text = "\n".join([
        'h_bucket{le="10",e="a"} 2', 'h_bucket{le="20",e="a"} 4', 'h_bucket{le="+Inf",e="a"} 4',
        'h_bucket{le="10",e="b"} 0', 'h_bucket{le="20",e="b"} 4', 'h_bucket{le="+Inf",e="b"} 4',
    ])  # fmt: skip
    h = parse_histograms(text, ("h",))["h"]
    assert h.buckets == {10.0: 2.0, 20.0: 8.0, float("inf"): 8.0}
    assert h.quantile(0.25) == 10.0  # rank 2: the top of the first bucket
    assert h.quantile(0.5) == pytest.approx(10 + 10 * (4 - 2) / 6)
    assert ScrapedHistogram("e", {}).quantile(0.5) is None


def test_a_scrape_without_the_histograms_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no vllm:iteration_tokens_total observation"):
        fit_from_scrape('vllm:num_requests_running{engine="0"} 3.0\n')
    with pytest.raises(ValueError, match="line 1: a bucket without le="):
        fit_from_scrape('vllm:time_to_first_token_seconds_bucket{engine="0"} 3.0\n')
    with pytest.raises(ValueError, match="line 1: a bucket must be a count"):
        fit_from_scrape('vllm:iteration_tokens_total_bucket{le="1"} -3.0\n')
    big = tmp_path / "big.txt"
    big.write_bytes(b"#" * (MAX_SCRAPE_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_scrape(str(big))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_scrape(str(bad))
    with pytest.raises(ValueError, match="No such file"):
        read_scrape(str(tmp_path / "missing.txt"))


REAL = Path(__file__).parent / "data" / "vllm_metrics_tiny.txt"


def test_a_real_engines_scrape_holds_what_it_was_sent() -> None:
    # 40 one-token completions, one at a time: 40 steps, each the prompt and
    # the one token it sampled; 40 TTFT observations
    text = read_scrape(str(REAL))
    hists = parse_histograms(
        text, ("vllm:iteration_tokens_total", "vllm:time_to_first_token_seconds")
    )
    steps, ttft = hists["vllm:iteration_tokens_total"], hists["vllm:time_to_first_token_seconds"]
    prompts = [32 + k * 928 // 39 for k in range(40)]
    assert steps.count == 40 and ttft.count == 40
    assert steps.total == sum(prompts) + 40
    # every prompt is in the bucket the engine counted it in
    for bound, cum in steps.buckets.items():
        assert cum == sum(1 for n in prompts if n + 1 <= bound)
    fit = fit_from_scrape(text)
    assert fit.mean_tokens_per_step == (sum(prompts) + 40) / 40
    assert fit.mean_ttft_ms == pytest.approx(1000 * ttft.total / 40)
    m = fit.model
    assert m.base_ms > 0 and m.per_prefill_token_ms > 0
    # the fit is a line through the pairs: longer steps, longer TTFT
    assert [p[0] for p in fit.pairs] == sorted(p[0] for p in fit.pairs)
