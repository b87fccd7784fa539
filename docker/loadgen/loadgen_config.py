"""The load generator's settings: flags over ``BLOCKPOOL_URL``,
``BLOCKPOOL_TOKEN`` and ``LOADGEN_*`` environment settings over defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

DESCRIPTION = "blockpool load generator: drives the REST API the way a test harness would."


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw else default


@dataclass
class Config:
    url: str = "http://127.0.0.1:8000"
    token: str | None = None
    concurrency: int = 8
    duration: float = 0.0  # seconds; 0 = forever
    stats_interval: float = 10.0
    max_5xx: int = 20  # consecutive 5xx responses before giving up
    max_transport_errors: int = 30  # consecutive connection failures before giving up
    wait_ready: float = 60.0  # seconds to wait for /api/health at start
    batch_fraction: float = 0.1
    summary_fraction: float = 0.02
    think_time: float = 0.01  # seconds between a request's calls
    decode_tokens: tuple[int, int] = (8, 96)
    seed: int | None = None
    heartbeat: str | None = None
    timeout: float = 10.0


def parse_args(argv: Sequence[str] | None = None) -> Config:
    ap = argparse.ArgumentParser(prog="loadgen", description=DESCRIPTION)
    ap.add_argument("--url", default=os.environ.get("BLOCKPOOL_URL", Config.url))
    ap.add_argument("--token", default=os.environ.get("BLOCKPOOL_TOKEN") or None)
    ap.add_argument("--concurrency", type=int, default=_env_int("LOADGEN_CONCURRENCY", 8))
    ap.add_argument(
        "--duration", type=float, default=_env_float("LOADGEN_DURATION", 0.0),
        help="seconds to run; 0 runs until SIGTERM/SIGINT (default)",
    )  # fmt: skip
    ap.add_argument("--stats-interval", type=float, default=10.0)
    ap.add_argument("--max-5xx", type=int, default=20, help="consecutive 5xx before exit 1")
    ap.add_argument("--max-transport-errors", type=int, default=30)
    ap.add_argument("--wait-ready", type=float, default=60.0)
    ap.add_argument("--batch-fraction", type=float, default=0.1)
    ap.add_argument("--think-time", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=_env_int("LOADGEN_SEED", -1))
    ap.add_argument("--heartbeat", default=os.environ.get("LOADGEN_HEARTBEAT") or None)
    a = ap.parse_args(argv)
    if a.concurrency < 1 or a.stats_interval <= 0 or a.duration < 0:
        ap.error("--concurrency must be >= 1, --stats-interval > 0, --duration >= 0")
    if not 0 <= a.batch_fraction <= 1:
        ap.error("--batch-fraction must be within [0, 1]")
    return Config(
        url=a.url.rstrip("/"),
        token=a.token,
        concurrency=a.concurrency,
        duration=a.duration,
        stats_interval=a.stats_interval,
        max_5xx=max(1, a.max_5xx),
        max_transport_errors=max(1, a.max_transport_errors),
        wait_ready=a.wait_ready,
        batch_fraction=a.batch_fraction,
        think_time=max(0.0, a.think_time),
        seed=None if a.seed < 0 else a.seed,
        heartbeat=a.heartbeat,
    )
