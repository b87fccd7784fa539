"""Every setting of the service, in one place (env prefix ``BLOCKPOOL_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

HashName = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]


class Settings(BaseSettings):
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
    tick_hz: float = Field(default=20.0, gt=0, le=200)
    event_log_capacity: int = Field(default=200_000, ge=100)
    sample_log_capacity: int = Field(default=50_000, ge=100)

    # --- limits
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    max_ids_per_call: int = Field(default=100_000, ge=1)
    max_tokens_per_request: int = Field(default=262_144, ge=1)
    max_batch_ops: int = Field(default=10_000, ge=1)
    max_requests: int = Field(default=100_000, ge=1)

    # --- the demo workload
    demo: bool = False
    demo_rate: float = Field(default=8.0, ge=0, le=10_000, description="requests per second")

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, v: object) -> object:
        # BLOCKPOOL_TOKEN= (empty) means "no token", not "the empty token".
        return None if isinstance(v, str) and not v.strip() else v

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
