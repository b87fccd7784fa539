"""What the operator's routes return: the hit rate windows, the analysis'
recent history, one request's story (built by app/pool/windowed.py,
app/analysis and app/pool/request_story.py as plain dicts: declared here)."""

from __future__ import annotations

from typing import Annotated, Any, NotRequired

from pydantic import Field, with_config
from typing_extensions import TypedDict

from app.pool.views.base import ITEM, Out
from app.pool.views.summary import Tokens


class HitWindowFigure(Out):
    label: str = Field(description="'hit rate 1m', 'hit rate 5m'")
    seconds: float
    hit_rate: float | None = Field(description="null: under two samples, or no query")
    promql: str = Field(description="the Grafana expression this figure matches")


class SinceStart(Out):
    label: str = Field(description="'since start', or 'since reset' after a prefix-cache reset")
    hit_rate: float | None
    hits_tokens: int
    queries_tokens: int
    seconds: float


class PoolRates(Out):
    """The prefix hit rate over 1 m and 5 m as Prometheus' rate(), since start; usage; requests."""

    windows: list[HitWindowFigure]
    since_start: SinceStart
    restarts: int = Field(description="prefix-cache resets that restarted the figures")
    samples: int
    sample_seconds: float
    usage: float = Field(description="vllm:kv_cache_usage_perc: the 0-1 fraction")
    requests_running: int | None = Field(
        description="vllm:num_requests_running: holding blocks; on a mirror the engine's "
        "running queue (null: not known, requests_reason says why)"
    )
    requests_waiting: int | None = Field(
        description="vllm:num_requests_waiting: the service's workloads' arrivals not admitted "
        "yet; on a mirror the engine's waiting queue (null: not known)"
    )
    requests_reason: str | None = Field(
        None, description="why requests_running / requests_waiting are null (null: known)"
    )


class RecentSection(Out):
    ts: float
    misses: dict[str, int]
    miss_tokens: dict[str, int]
    hit_blocks: int
    regrets: int
    evictions: int
    tokens: Tokens
    tokens_ts: float


class AnalysisRecent(Out):
    """The analysis sections' counters once a second, oldest first (charts start here)."""

    enabled: bool
    every_seconds: float
    capacity: int
    sections: list[RecentSection]


class StoryTimes(Out):
    first_attempt_at: float | None
    admitted_at: float | None
    first_decode_at: float | None
    last_decode_at: float | None
    finished_at: float | None


class StoryDecode(Out):
    steps: int
    tokens: int
    new_blocks: int


@with_config(ITEM)
class StoryBlock(TypedDict):
    index: int
    kind: Annotated[str, Field(description="prompt or decode")]
    tokens: int | None
    block_ids: Annotated[list[int] | None, Field(description="one per group (null: not known)")]
    hit: bool
    reason: Annotated[
        str | None, Field(description="why a prompt block missed (null: a hit, decode)")
    ]
    detail: dict[str, Any] | None
    added_at: float | None
    hash: NotRequired[
        Annotated[str | None, Field(None, description="on a mirror: the block's hash, 64-bit form")]
    ]


class RequestStory(Out):
    """One request: blocks, hits, misses with reasons; when admitted, decoded, finished."""

    request_id: str
    state: str = Field(description="running, finished or refused")
    num_prompt_tokens: int | None
    num_tokens: int | None
    lora_name: str | None
    cache_salt: str | None
    num_hit_blocks: int | None
    hit_tokens: int | None
    misses: dict[str, int]
    times: StoryTimes
    admissions_refused: int
    preemptions: int | None = Field(None, description="on a mirror: the engine's preemptions")
    decode: StoryDecode
    blocks: list[StoryBlock]
    timeline: list[dict[str, Any]] = Field(description="the recorded operations, oldest first")
    timeline_omitted: int
    earlier_lives: int = Field(description="earlier uses of this id (left out)")
    sources: dict[str, Any] = Field(description="which of manager, analysis, recording answered")
    limits: dict[str, int]
