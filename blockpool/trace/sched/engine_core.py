"""The engine loop above the scheduler, on simulated time.

One engine step is vLLM 0.16's ``EngineCore.step`` (synchronous: schedule,
run, ``update_from_output``) or ``step_with_batch_queue`` with a queue of two
(asynchronous scheduling): schedule step ``N + 1`` while step ``N`` runs,
then apply step ``N``'s tokens -- so frees, and the caching of decode blocks,
land one step late.  A step that scheduled nothing is not waited on.

Step time is a :class:`StepModel`: ``base_ms + per_prefill_token_ms x
prefill tokens + per_decode_seq_ms x decoding requests`` of the step
scheduled; :func:`fit_step_model` calibrates one from measured steps.
A request's first token is out when the step that sampled it ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from blockpool.trace.sched.sched_request import SchedRequest
from blockpool.trace.sched.scheduler import Scheduler, StepPlan


@dataclass(frozen=True)
class StepModel:
    """Milliseconds a step takes, from what it scheduled."""

    base_ms: float = 20.0
    per_prefill_token_ms: float = 0.0
    per_decode_seq_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.base_ms > 0:
            raise ValueError(f"base_ms must be > 0, got {self.base_ms!r}")
        if self.per_prefill_token_ms < 0 or self.per_decode_seq_ms < 0:
            raise ValueError("per_prefill_token_ms and per_decode_seq_ms must be >= 0")

    def ms(self, plan: StepPlan) -> float:
        return (
            self.base_ms
            + self.per_prefill_token_ms * plan.prefill_tokens
            + self.per_decode_seq_ms * plan.decode_seqs
        )

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> StepModel:
        """``{"base_ms": .., "per_prefill_token_ms": .., "per_decode_seq_ms": ..}``
        or ``{"samples": [[prefill_tokens, decode_seqs, ms], ...]}`` (fitted)."""
        if not isinstance(doc, dict):
            raise ValueError("a step model must be a JSON object")
        if "samples" in doc:
            return fit_step_model(doc["samples"])
        known = {"base_ms", "per_prefill_token_ms", "per_decode_seq_ms"}
        extra = set(doc) - known
        if extra:
            raise ValueError(f"unknown step model field(s): {', '.join(sorted(extra))}")
        vals: dict[str, float] = {}
        for k, v in doc.items():
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"step model field {k!r} must be a number, got {v!r}")
            vals[k] = float(v)
        return cls(**vals)


def fit_step_model(samples: Sequence[Sequence[float]]) -> StepModel:
    """Least squares of ``ms ~ base + a x prefill_tokens + b x decode_seqs``
    over measured steps ``(prefill_tokens, decode_seqs, ms)``; negative
    slopes are clamped to 0 (and the rest refitted)."""
    rows: list[tuple[float, float, float]] = []
    for i, s in enumerate(samples):
        if not isinstance(s, list | tuple) or len(s) != 3:
            raise ValueError(f"sample {i}: expected [prefill_tokens, decode_seqs, ms], got {s!r}")
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in s):
            raise ValueError(f"sample {i}: numbers expected, got {s!r}")
        p, d, ms = (float(v) for v in s)
        if p < 0 or d < 0 or not ms > 0:
            raise ValueError(f"sample {i}: counts must be >= 0 and ms > 0, got {s!r}")
        rows.append((p, d, ms))
    if len(rows) < 3:
        raise ValueError(f"a step model needs at least 3 samples, got {len(rows)}")
    use = [True, True]
    while True:
        coef = _lstsq(rows, use)
        neg = [j for j in range(2) if use[j] and coef[j + 1] < 0]
        if not neg:
            break
        use[neg[0]] = False
    base = coef[0] if coef[0] > 0 else min(r[2] for r in rows)
    return StepModel(base, coef[1], coef[2])


def _lstsq(rows: list[tuple[float, float, float]], use: list[bool]) -> list[float]:
    cols = [0] + [j + 1 for j in range(2) if use[j]]
    x = [[1.0, r[0], r[1]] for r in rows]
    k = len(cols)
    a = [[sum(xr[cols[i]] * xr[cols[j]] for xr in x) for j in range(k)] for i in range(k)]
    b = [sum(xr[cols[i]] * r[2] for xr, r in zip(x, rows, strict=True)) for i in range(k)]
    for c in range(k):  # Gauss-Jordan with partial pivoting
        p = max(range(c, k), key=lambda i: abs(a[i][c]))
        if abs(a[p][c]) < 1e-12:
            raise ValueError("the samples do not tell the step model's terms apart")
        a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
        for i in range(k):
            if i != c:
                f = a[i][c] / a[c][c]
                a[i] = [ai - f * ac for ai, ac in zip(a[i], a[c], strict=True)]
                b[i] -= f * b[c]
    sol = [b[i] / a[i][i] for i in range(k)]
    out = [0.0, 0.0, 0.0]
    for i, c in enumerate(cols):
        out[c] = sol[i]
    return out


class SimulatedEngineCore:
    """Steps a :class:`Scheduler` as vLLM's engine core does."""

    def __init__(self, scheduler: Scheduler, step_model: StepModel | None = None) -> None:
        self.scheduler = scheduler
        self.model = step_model or StepModel()
        self.async_ = scheduler.config.async_scheduling
        self.in_flight: deque[tuple[StepPlan, float]] = deque()
        self.steps = 0

    def busy(self) -> bool:
        return self.scheduler.has_requests() or bool(self.in_flight)

    def step(self, now_ms: float) -> tuple[float, list[SchedRequest]]:
        """One engine step at ``now_ms``: (ms it took, requests finished)."""
        sched = self.scheduler
        if not self.async_:
            if not sched.has_requests():
                return 0.0, []
            self.steps += 1
            plan = sched.schedule(now_ms)
            dt = self.model.ms(plan)
            return dt, sched.update(plan, now_ms + dt)
        dt = 0.0
        q = self.in_flight
        if sched.has_requests():
            self.steps += 1
            plan = sched.schedule(now_ms)
            dt = self.model.ms(plan)
            q.appendleft((plan, now_ms + dt))
            if plan.num_scheduled and len(q) < 2:
                return dt, []
        elif not q:
            return 0.0, []
        plan, done = q.pop()
        return dt, sched.update(plan, done)
