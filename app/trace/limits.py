"""What an uploaded trace may imply on this service, and its refusal.

The bounds (:func:`service_limits`, :func:`check_trace`): requests, tokens a
request (the service's ``max_tokens_per_request`` and what the pool can
hold), tokens in all, tokens per id, arrival times; a refusal names the
line, the field and the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.shared.errors import InvalidInput
from blockpool.trace import Trace, TraceLimits, TraceRequest

if TYPE_CHECKING:
    from app.shared.settings import Settings

MAX_TOKEN_ID = 2**31 - 1
MAX_TOKENS_PER_ID = 65_536
MAX_TIMESTAMP_MS = 30 * 86_400_000.0  # 30 days of trace time
MAX_EXTRA_KEY = 200  # lora_name / cache_salt characters (the admit op's bound)


class TraceRefused(InvalidInput, ValueError):
    """A trace the service will not replay (a 422; ``serve --trace``: invalid settings)."""

    code = "invalid_input"  # an invalid input like any other, not a code of its own


def service_limits(settings: Settings) -> TraceLimits:
    """The bounds an uploaded trace is read under."""
    return TraceLimits(
        max_requests=settings.trace_max_requests,
        max_tokens_per_request=settings.max_tokens_per_request,
        max_total_tokens=settings.trace_max_tokens,
        max_tokens_per_id=MAX_TOKENS_PER_ID,
        max_timestamp_ms=MAX_TIMESTAMP_MS,
    )


def _refuse(
    message: str, req: TraceRequest | None, field: str | None, limit: str, **more: Any
) -> None:
    line = req.line if req is not None else 0
    where = f"line {line}: " if line else ""
    raise TraceRefused(f"{where}{message}", line=line, field=field, limit=limit, **more)


def check_trace(trace: Trace, settings: Settings) -> None:
    """Refuse (TraceRefused, nothing loaded) a trace the service cannot replay:
    every request must fit a request's limit and the pool, the whole within
    the service's bounds, its token ids within the service's range."""
    limits = service_limits(settings)
    reqs = trace.requests
    if len(reqs) > limits.max_requests:
        _refuse(
            f"the trace holds {len(reqs)} requests; this server takes at most "
            f"{limits.max_requests} (trace_max_requests)",
            reqs[limits.max_requests], None, "trace_max_requests",
        )  # fmt: skip
    if trace.tokens_per_id > limits.max_tokens_per_id:
        _refuse(
            f"tokens per id {trace.tokens_per_id} is over this server's limit of "
            f"{limits.max_tokens_per_id} (max_tokens_per_id)",
            None, "tokens_per_id", "max_tokens_per_id",
        )  # fmt: skip
    cap = settings.max_tokens_per_request
    bs, groups = settings.block_size, settings.num_groups
    usable = settings.effective_num_blocks - 1
    total = 0
    for r in reqs:
        n = r.input_length + r.output_length
        if n > cap:
            _refuse(
                f"a request of the trace holds {n} tokens; this server takes at most {cap} per "
                "request (max_tokens_per_request)",
                r, "input_length", "max_tokens_per_request", longest=n,
            )  # fmt: skip
        need = -(-n // bs) * groups
        if need > usable:
            _refuse(
                f"a request of the trace needs {need} blocks for its {n} tokens; the pool holds "
                f"{usable} besides the null block (num_blocks)",
                r, "input_length", "num_blocks", blocks=need, pool_blocks=usable,
            )  # fmt: skip
        if r.timestamp_ms > limits.max_timestamp_ms:
            _refuse(
                f"an arrival at {r.timestamp_ms:g} ms is past this server's limit of "
                f"{limits.max_timestamp_ms:g} ms (max_timestamp_ms)",
                r, "timestamp", "max_timestamp_ms",
            )  # fmt: skip
        for key in ("lora_name", "cache_salt"):
            v = getattr(r, key)
            if v is not None and not 1 <= len(v) <= MAX_EXTRA_KEY:
                _refuse(f"{key} must hold 1..{MAX_EXTRA_KEY} characters", r, key, key)
        total += n
        if total > limits.max_total_tokens:
            _refuse(
                f"the trace's requests hold more than {limits.max_total_tokens} tokens in all; "
                "this server takes at most that (trace_max_tokens)",
                r, "input_length", "trace_max_tokens",
            )  # fmt: skip
    top = trace.max_token_id()
    if top > MAX_TOKEN_ID:
        _refuse(
            f"the trace's token ids reach {top}, above the service's {MAX_TOKEN_ID}",
            None, "hash_ids", "max_token_id", max_token_id=top,
        )  # fmt: skip
