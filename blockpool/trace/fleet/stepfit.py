"""A step model fitted from a vLLM engine's ``/metrics`` scrape (saved text).

Two histograms every vLLM v1 engine exports: ``vllm:iteration_tokens_total``
(tokens scheduled per engine step) and ``vllm:time_to_first_token_seconds``.
The fit pairs their quantiles: for ``q`` in 0.1, 0.2 .. 0.9 the ``q``-quantile
of tokens per step with the ``q``-quantile of TTFT (each interpolated
linearly inside its bucket, as Prometheus's ``histogram_quantile`` does) and
fits ``ms = base_ms + per_token_ms x tokens`` by least squares
; a decoding request is one
token of a step, so ``per_decode_seq_ms = per_prefill_token_ms =
per_token_ms``.  It holds where a request's TTFT is the one step that
prefilled it: a lightly loaded engine, whole prompts, no queueing.  On a busy
engine TTFT includes waiting and the fit overstates the step time: give the
coefficients instead (``--step-model``, ``--step-ms``...).  The fit says
how far it is: the exact means (the histograms' ``_sum / _count``) of tokens
a step and of TTFT, against the fitted step time at that mean.  Quantiles that
fall in a ``+Inf`` bucket are left out; fewer than 3 left is an error.

Every series of a histogram (one per model / engine label set) is summed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from blockpool.common.bounded_read import read_bounded
from blockpool.trace.sched.engine_core import StepModel

ITERATION_TOKENS = "vllm:iteration_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
MAX_SCRAPE_BYTES = 16 * 1024 * 1024
QUANTILES = tuple(k / 10 for k in range(1, 10))

_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LE = re.compile(r'(?:^|,)\s*le="(?P<le>[^"]*)"')


@dataclass
class ScrapedHistogram:
    """Cumulative bucket counts by upper bound (``inf`` included)."""

    name: str
    buckets: dict[float, float]
    total: float = 0.0  # the ``_sum`` series: the observations' exact sum

    @property
    def count(self) -> float:
        return self.buckets.get(math.inf, 0.0)

    def quantile(self, q: float) -> float | None:
        """Linear inside the bucket (None: in the ``+Inf`` bucket, or empty)."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound in sorted(self.buckets):
            cum = self.buckets[bound]
            if cum >= rank:
                if math.isinf(bound):
                    return None
                inside = cum - below
                if inside <= 0:
                    return bound
                return lower + (bound - lower) * (rank - below) / inside
            lower, below = bound, cum
        return None


def parse_histograms(text: str, names: tuple[str, ...]) -> dict[str, ScrapedHistogram]:
    """The named histograms of a Prometheus text scrape (series summed)."""
    out = {n: ScrapedHistogram(n, {}) for n in names}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name = m.group("name")
        if name.endswith("_sum") and name[: -len("_sum")] in out:
            try:
                out[name[: -len("_sum")]].total += float(m.group("value"))
            except ValueError:
                raise ValueError(f"line {lineno}: not a number") from None
            continue
        if not name.endswith("_bucket") or name[: -len("_bucket")] not in out:
            continue
        le = _LE.search(m.group("labels") or "")
        if le is None:
            raise ValueError(f"line {lineno}: a bucket without le=")
        try:
            bound = float(le.group("le"))
            value = float(m.group("value"))
        except ValueError:
            raise ValueError(f"line {lineno}: not a number") from None
        if math.isnan(bound) or not math.isfinite(value) or value < 0:
            raise ValueError(f"line {lineno}: a bucket must be a count >= 0")
        h = out[name[: -len("_bucket")]].buckets
        h[bound] = h.get(bound, 0.0) + value
    return out


@dataclass
class ScrapeFit:
    """The fitted model, the quantile pairs ``[tokens, 0, ms]`` it was fitted
    on, and a check from the histograms' exact sums: the mean tokens a step,
    the mean TTFT, and the fitted model's step time at that mean (far from
    the mean TTFT: the scrape does not fit the model's assumption)."""

    model: StepModel
    pairs: list[list[float]]
    mean_tokens_per_step: float
    mean_ttft_ms: float
    fitted_ms_at_mean: float

    def to_json(self) -> dict[str, object]:
        return {
            "pairs": self.pairs,
            "mean_tokens_per_step": self.mean_tokens_per_step,
            "mean_ttft_ms": self.mean_ttft_ms,
            "fitted_ms_at_mean": self.fitted_ms_at_mean,
        }


def fit_from_scrape(text: str) -> ScrapeFit:
    """The step model fitted on the scrape's quantile pairs, and its check."""
    if len(text.encode("utf-8", "replace")) > MAX_SCRAPE_BYTES:
        raise ValueError(f"a scrape larger than {MAX_SCRAPE_BYTES} bytes")
    hists = parse_histograms(text, (ITERATION_TOKENS, TTFT))
    for name, h in hists.items():
        if h.count <= 0:
            raise ValueError(f"the scrape has no {name} observation (a vLLM v1 engine's /metrics)")
    pairs: list[list[float]] = []
    for q in QUANTILES:
        tokens = hists[ITERATION_TOKENS].quantile(q)
        secs = hists[TTFT].quantile(q)
        if tokens is None or secs is None or not secs > 0:
            continue
        pairs.append([tokens, 0.0, secs * 1000.0])
    if len(pairs) < 3:
        raise ValueError("fewer than 3 quantiles of the scrape are finite: no fit")
    base, per_token = _line(pairs)
    tok, ttft = hists[ITERATION_TOKENS], hists[TTFT]
    mean_tokens = tok.total / tok.count
    return ScrapeFit(
        StepModel(base, per_token, per_token),
        pairs,
        mean_tokens,
        1000.0 * ttft.total / ttft.count,
        base + per_token * mean_tokens,
    )


def _line(pairs: list[list[float]]) -> tuple[float, float]:
    """Least squares ``ms = base + slope x tokens``; a negative slope is 0,
    a base <= 0 the smallest ms (a step always takes time)."""
    xs = [p[0] for p in pairs]
    ys = [p[2] for p in pairs]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    slope = max(slope, 0.0)
    base = my - slope * mx
    return (base if base > 0 else min(ys)), slope


def read_scrape(path: str) -> str:
    """A saved scrape's text (size-limited; ValueError naming the file)."""
    data = read_bounded(path, MAX_SCRAPE_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a /metrics scrape)") from None
