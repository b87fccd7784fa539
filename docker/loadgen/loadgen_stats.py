"""The load generator's statistics and the line it prints of them."""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Stats:
    started: float = field(default_factory=time.monotonic)
    calls: int = 0
    admitted: int = 0
    finished: int = 0
    preempted: int = 0
    admit_retries: int = 0
    gave_up: int = 0
    batches: int = 0
    appended_tokens: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    status_409: int = 0
    status_4xx: int = 0
    status_5xx: int = 0
    transport_errors: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=20_000))

    def line(self, running: int) -> str:
        elapsed = time.monotonic() - self.started
        lat = sorted(self.latencies_ms)
        p50 = statistics.median(lat) if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
        hit = self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return (
            f"[loadgen] t={elapsed:.0f}s calls={self.calls} admitted={self.admitted} "
            f"finished={self.finished} preempted={self.preempted} batches={self.batches} "
            f"decode_tokens={self.appended_tokens} hit_rate={hit:.3f} "
            f"409={self.status_409} retries={self.admit_retries} gave_up={self.gave_up} "
            f"4xx={self.status_4xx} 5xx={self.status_5xx} transport={self.transport_errors} "
            f"p50={p50:.1f}ms p99={p99:.1f}ms running={running}"
        )
