"""The settings of the pool service (``Settings``, env prefix ``BLOCKPOOL_``) and
of the observer (``ObserverSettings``, ``BLOCKPOOL_OBSERVER_``), both on the
connection limits of ``ServingSettings`` (app/shared/serving.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from app.shared.serving import ServingSettings
from blockpool.core.free_order import APPEND_ALL, FreeOrder
from blockpool.kvevents.config import KVEventsConfig, SourceSpec, plan_sources
from blockpool.shadow import POLICY_NAMES, policy_name

HashName = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
SHADOW_POLICIES: tuple[str, ...] = POLICY_NAMES  # the library's list, the one list


class Settings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="BLOCKPOOL_", extra="ignore")

    # --- the pool
    num_blocks: int | None = Field(
        default=None, ge=2, le=4_000_000, description="blocks in the pool (incl. the null block)"
    )
    memory_budget_bytes: int | None = Field(
        default=None, gt=0, description="derive num_blocks from this K/V byte budget (storage on)"
    )
    block_size: int = Field(default=16, ge=1, le=1024)
    num_groups: int = Field(default=1, ge=1, le=16, description="KV-cache groups")
    hash_fn: HashName = "sha256"
    hash_seed: str = Field(default="0", description="NONE_HASH seed (PYTHONHASHSEED role)")
    enable_caching: bool = True
    free_order: FreeOrder = Field(
        default=APPEND_ALL,
        description="append_all: vLLM 0.16 (every freed block to the queue's tail); "
        "uncached_first: vLLM >= 0.24 (freed blocks without a hash to the head)",
    )
    enable_events: bool = True
    metrics_sample_rate: float = Field(default=0.01, gt=0, le=1)
    model_name: str = "blockpool-demo"

    # --- K/V storage (torch); off: metadata only
    storage: bool = True
    storage_device: str | None = None
    num_layers: int = Field(default=2, ge=1, le=256)
    num_kv_heads: int = Field(default=2, ge=1, le=256)
    head_size: int = Field(default=16, ge=1, le=1024)

    # --- the server
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    token: str | None = Field(default=None, description="bearer token for mutating endpoints")
    protect_reads: bool = False
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names browsers may use besides loopback names, IP addresses and "
        "--host ('*': any); others are refused (DNS rebinding)",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="origins (scheme://host[:port]) whose pages may send mutating requests "
        "besides the server's own",
    )
    costly_reads_burst: int = Field(
        default=8, ge=1, le=100_000,
        description="with a token: units of costly reads a client without it may burst "
        "(a call: 1, +1 per 256 KiB of body; the export or its size: half)",
    )  # fmt: skip
    costly_reads_per_s: float = Field(
        default=0.5, gt=0, le=100_000, description="units a second that ration refills"
    )
    costly_reads_global_burst: int = Field(
        default=32, ge=1, le=1_000_000,
        description="units of costly reads all clients without the token may burst together",
    )  # fmt: skip
    costly_reads_global_per_s: float = Field(
        default=2.0, gt=0, le=1_000_000, description="units a second that shared ration refills"
    )
    tick_hz: float = Field(default=20.0, gt=0, le=200)
    event_log_capacity: int = Field(default=200_000, ge=100)
    event_log_max_tokens: int = Field(
        default=32_000_000,
        ge=1000,
        description="the event log's weight bound: token ids + hashes its events hold",
    )
    sample_log_capacity: int = Field(default=50_000, ge=100)

    # --- limits
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_ids_per_call: int = Field(default=100_000, ge=1)
    max_tokens_per_request: int = Field(default=262_144, ge=1)
    max_batch_ops: int = Field(default=10_000, ge=1)
    max_requests: int = Field(default=100_000, ge=1)
    ws_max_message_bytes: int = Field(
        default=4096, ge=256, le=1024 * 1024, description="a client's websocket message, at most"
    )
    stream_request_rate: float = Field(
        default=2.0, gt=0, le=1000, description="resumes + snapshots a stream client may ask per s"
    )
    stream_request_burst: int = Field(
        default=8, ge=1, le=10_000, description="... and at once (token bucket size)"
    )
    stream_max_refused: int = Field(
        default=16, ge=1, le=10_000, description="refusals within a minute that close the socket"
    )

    # --- vLLM's ZMQ KV-event stream (vLLM's KVEventsConfig names)
    kv_events_publisher: bool = Field(
        default=False, description="publish KV events over ZMQ as vLLM 0.16 does"
    )
    kv_events_endpoint: str = Field(default="tcp://*:5557", description="PUB endpoint")
    kv_events_replay_endpoint: str | None = Field(
        default=None, description="ROUTER endpoint serving replays (none: no replay)"
    )
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = Field(default=10_000, ge=1, description="batches kept for replay")
    kv_events_hwm: int = Field(default=100_000, ge=1, description="ZMQ high-water mark")
    kv_events_max_queue_size: int = Field(
        default=100_000, ge=1, description="batches queued for the publisher thread"
    )
    kv_events_data_parallel_rank: int = Field(
        default=0, ge=0, le=4096, description="the DP rank: both ports move up by it"
    )
    kv_events_bind: Literal["auto", "bind", "connect"] = Field(
        default="auto",
        description="auto: vLLM's rule (bind wildcard/ipc addresses, connect to others)",
    )
    kv_events_format: Literal["v016", "map"] = Field(
        default="v016",
        description="v016: vLLM 0.16's positional events; map: the current vLLM's "
        "map-tagged events (group_idx, kv_cache_spec_kind, ...)",
    )
    fleet_url: str | None = Field(
        default=None,
        description="the page of a blockpool observe that follows this server's KV events: "
        "the dashboard's 'fleet' link opens it (none: no link)",
    )

    @field_validator("fleet_url", mode="before")
    @classmethod
    def _fleet_url_is_http(cls, v: object) -> object:
        if isinstance(v, str) and not v.strip():
            return None
        if isinstance(v, str) and (
            not v.startswith(("http://", "https://")) or "@" in v.split("/")[2]
        ):
            raise ValueError("fleet_url is an http(s):// URL without credentials")
        return v

    # --- serve --mirror: following a real engine (README: Watch your vLLM)
    mirror_token_file: str | None = Field(
        default=None,
        description="a file whose first line is the secret shared with the engine's plugin "
        "(its BLOCKPOOL_MIRROR_TOKEN_FILE): every message must be signed with it",
    )
    mirror_max_lag_s: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="the mirror is 'behind' (not exact) while a message older than this "
        "waits to be applied",
    )
    mirror_max_backlog: int = Field(
        default=10_000,
        ge=10,
        le=1_000_000,
        description="messages waiting at most; past it they are dropped for a fresh snapshot",
    )

    @field_validator("mirror_token_file", mode="before")
    @classmethod
    def _no_token_file(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    # --- analysis: miss reasons, eviction regret, shadow pools, recording
    metrics_seed: int | None = Field(
        default=0, description="seed of the metrics collector's sampling (None: unseeded)"
    )
    analysis: bool = Field(default=True, description="miss reasons, regret, shadows, recording")
    analysis_mode: Literal["worker", "inline"] = Field(
        default="worker",
        description="worker: a replica in a worker process analyses the recorded operations "
        "(needs the recording); inline: on the engine, exact and synchronous",
    )
    shadow_mode: Literal["process", "inline", "off"] = Field(
        default="process",
        description="shadow pools in a worker process, on the engine, or none (inline "
        "analysis; with analysis_mode=worker they run in the worker's replica unless off)",
    )
    shadow_factors: list[float] = Field(
        default_factory=lambda: [0.5, 2.0, 4.0],
        description="capacities (times the real pool) of vLLM 0.16 shadows",
    )
    shadow_policies: list[str] = Field(
        default_factory=lambda: list(SHADOW_POLICIES),
        description=f"free-order policies shadowed at 1x ({', '.join(SHADOW_POLICIES)})",
    )
    shadow_grid: bool = Field(default=False, description="every policy at every capacity")
    shadow_max_lag: int = Field(
        default=200_000, ge=100, description="accesses queued for the shadows before a resync"
    )
    recording: bool = Field(default=True, description="record operations for time travel")
    recording_max_ops: int = Field(default=100_000, ge=100)
    recording_max_bytes: int = Field(
        default=64 * 1024 * 1024, ge=65536, description="encoded bytes the recording keeps"
    )
    recording_keyframe_ops: int = Field(
        default=2000, ge=10, description="operations between keyframes (state snapshots)"
    )
    miss_index_size: int = Field(
        default=200_000, ge=100, description="evicted hashes / prefixes remembered for reasons"
    )
    miss_finished_kept: int = Field(
        default=2000, ge=0, description="finished requests whose miss reasons are kept"
    )

    # --- the demo workload
    demo: bool = False
    demo_rate: float = Field(default=8.0, ge=0, le=500, description="requests per second")
    # --- a production trace instead of the demo (app/trace/driver.py)
    trace: str | None = Field(default=None, description="Mooncake JSONL (or recording) to replay")
    trace_speed: float = Field(default=1.0, gt=0, le=10_000, description="arrivals x speed")
    trace_loop: bool = False
    trace_max_requests: int = Field(
        default=100_000, ge=1, description="requests an uploaded or served trace may hold"
    )
    trace_max_tokens: int = Field(
        default=1_000_000_000, ge=1, description="input + output tokens of all its requests"
    )

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        # BLOCKPOOL_TOKEN= (empty) means "no token", not "the empty token".
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("kv_events_replay_endpoint", mode="before")
    @classmethod
    def _no_replay(cls, v: object) -> object:
        return None if isinstance(v, str) and v.strip().lower() in ("", "none") else v

    @field_validator("shadow_policies")
    @classmethod
    def _known_policies(cls, v: list[str]) -> list[str]:
        return [policy_name(p) for p in v]  # an old spelling ("vllm016") is accepted

    @model_validator(mode="after")
    def _kv_events(self) -> Settings:
        if self.kv_events_publisher:
            if not self.enable_events:
                raise ValueError("kv_events_publisher needs KV events on (enable_events)")
            self.kv_events_config()  # raises ValueError on a bad endpoint
        return self

    def kv_events_config(self) -> KVEventsConfig:
        return KVEventsConfig(
            endpoint=self.kv_events_endpoint,
            replay_endpoint=self.kv_events_replay_endpoint,
            buffer_steps=self.kv_events_buffer_steps,
            hwm=self.kv_events_hwm,
            max_queue_size=self.kv_events_max_queue_size,
            topic=self.kv_events_topic,
            data_parallel_rank=self.kv_events_data_parallel_rank,
            bind=self.kv_events_bind,
            events_format=self.kv_events_format,
        )

    @model_validator(mode="after")
    def _one_size(self) -> Settings:
        if self.num_blocks is not None and self.memory_budget_bytes is not None:
            raise ValueError("give num_blocks or memory_budget_bytes, not both")
        if self.memory_budget_bytes is not None and not self.storage:
            raise ValueError("memory_budget_bytes needs storage on")
        return self

    @property
    def effective_num_blocks(self) -> int:
        return self.num_blocks if self.num_blocks is not None else 8192


def _per_batch(default: int, what: str) -> Any:
    """A bound on one batch from a publisher: 1 .. 2^31 of ``what``."""
    return Field(
        default=default,
        ge=1,
        le=1 << 31,
        description=f"{what} per batch at most; a larger batch is refused",
    )


class ObserverSettings(ServingSettings):
    """``blockpool observe``: the streams to follow and the server showing them
    (env prefix ``BLOCKPOOL_OBSERVER_``; lists as JSON)."""

    model_config = SettingsConfigDict(env_prefix="BLOCKPOOL_OBSERVER_", extra="ignore")

    endpoints: list[str] = Field(
        default_factory=list, description="PUB endpoints to follow: [name=]tcp://host:port"
    )
    replay_endpoints: list[str] = Field(
        default_factory=list, description="one ROUTER endpoint per endpoint ('none': no replay)"
    )
    bind_endpoints: list[str] = Field(
        default_factory=list,
        description="addresses to bind for publishers that connect: [name=]tcp://host:port",
    )
    dashboards: list[str] = Field(
        default_factory=list,
        description="NAME=http(s)://host:port/ of each instance's own dashboard (a "
        "blockpool serve --mirror of that engine): its card on the fleet page links it",
    )
    dp_size: int = Field(default=1, ge=1, le=1024, description="DP ranks per endpoint")
    topic: str = Field(default="", description="topic prefix to subscribe to ('' = all)")
    bootstrap_replay: bool = Field(
        default=True, description="on joining mid-stream, ask the replay socket for seq 0 on"
    )
    replay_timeout_s: float = Field(default=3.0, gt=0, le=600)
    replay_backoff_s: float = Field(default=10.0, ge=0, le=3600)
    max_pending: int = Field(default=100_000, ge=1, description="live batches held per replay")
    rcvhwm: int = Field(default=100_000, ge=0, description="SUB socket high-water mark")
    event_log_capacity: int = Field(default=20_000, ge=100, description="events kept per pool")
    max_batch_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="a larger message is refused unread"
    )
    max_batch_hashes: int = _per_batch(32_768, "block hashes")
    max_batch_events: int = _per_batch(8_192, "events")
    max_batch_tokens: int = _per_batch(524_288, "token ids (of BlockStored)")
    silence_s: float = Field(
        default=10.0, gt=0, le=86_400,
        description="seconds without any message before the fleet card says what to check",
    )  # fmt: skip
    max_hashes: int = Field(
        default=2_000_000, ge=1, le=1 << 31,
        description="hashes held per pool at most; more are counted (overflow), not kept",
    )  # fmt: skip
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, le=1 << 30,
        description="a larger request body is refused (413) before it is read",
    )  # fmt: skip

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    token: str | None = Field(default=None, description="bearer token for every read")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names browsers may use (see serve's)"
    )
    allowed_origins: list[str] = Field(
        default_factory=list, description="page origins that may POST or open the stream"
    )
    tick_hz: float = Field(default=5.0, gt=0, le=100, description="websocket updates per second")
    ws_queue: int = Field(default=64, ge=2, le=10_000, description="messages queued per client")

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _plan(self) -> ObserverSettings:
        if self.endpoints or self.bind_endpoints:
            self.sources()  # raises ValueError on a bad plan
        self.dashboard_urls()
        return self

    def dashboard_urls(self) -> dict[str, str]:
        """Instance name -> its dashboard's URL (ValueError: a bad ``dashboards`` item)."""
        names = {s.name for s in self.sources()} if self.endpoints or self.bind_endpoints else set()
        out: dict[str, str] = {}
        for item in self.dashboards:
            name, eq, url = item.partition("=")
            if not eq or not url.startswith(("http://", "https://")) or "@" in url.split("/")[2]:
                raise ValueError(
                    f"dashboard of {name[:100]!r}: give NAME=http(s)://host:port/ "
                    "without credentials"
                )
            if name not in names:
                known = ", ".join(sorted(names)) or "none"
                raise ValueError(f"dashboard {name[:100]!r} names no instance (they are: {known})")
            out[name] = url
        return out

    def sources(self) -> list[SourceSpec]:
        replays: list[str | None] = list(self.replay_endpoints)
        return plan_sources(self.endpoints, replays, self.dp_size, self.bind_endpoints)
