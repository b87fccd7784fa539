"""What the trace-replay routes return."""

from __future__ import annotations

from pydantic import Field

from app.pool.views.base import Out


class TraceStats(Out):
    arrived: int
    admitted: int
    finished: int
    refused: int = Field(description="requests that can never fit this pool")
    preemptions: int
    loops: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float = Field(description="the trace's own prefix hit rate (hit / prompt tokens)")


class TraceBound(Out):
    """The loaded trace replayed one request at a time on this pool's size."""

    model: str = Field(description="sequence: requests one at a time, prompt blocks only")
    blocks: int
    prompt_tokens: int
    lru_hit_rate: float = Field(description="vLLM's LRU free queue")
    optimal_hit_rate: float = Field(description="the offline optimum (Belady's MIN)")
    unbounded_hit_rate: float = Field(description="a pool that never evicts")


class TraceStatus(Out):
    """A trace replay driving the engine: progress and the trace's hit rate."""

    loaded: bool
    name: str | None
    running: bool
    speed: float
    loop: bool
    requests: int
    trace_ms: float = Field(description="the replay's position in the trace's own time")
    trace_end_ms: float
    progress: float = Field(description="0-1: requests arrived of this pass")
    requests_running: int
    requests_waiting: int
    stats: TraceStats
    bound: TraceBound | None = Field(
        None, description="LRU against the offline optimum on the loaded trace (null: computing)"
    )
