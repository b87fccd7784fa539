"""What shapes a runtime: the pool, hashing, sampling and the limits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from blockpool.core.free_order import APPEND_ALL, FreeOrder


@dataclass(frozen=True)
class RuntimeConfig:
    num_blocks: int
    block_size: int = 16
    num_groups: int = 1
    hash_fn: str = "sha256"
    hash_seed: str = "0"
    enable_caching: bool = True
    enable_events: bool = True
    free_order: FreeOrder = APPEND_ALL  # or UNCACHED_FIRST (vLLM >= 0.24)
    metrics_sample_rate: float = 0.01
    metrics_seed: int | None = 0
    # limits: every operation over one is refused before it changes anything
    max_ids_per_call: int = 100_000
    max_tokens_per_request: int = 262_144
    max_requests: int = 100_000
    # bounded logs of KV events and eviction samples
    event_log_capacity: int = 200_000
    # ... and by weight: the token ids and hashes its events carry (a
    # 262,144-token admission is one event of ~9 MB)
    event_log_max_tokens: int = 32_000_000
    sample_log_capacity: int = 50_000

    @classmethod
    def from_mapping(cls, values: object) -> RuntimeConfig:
        """The fields this config has, taken from a mapping or an object
        with those attributes (settings); the rest keep their defaults."""
        names = [f.name for f in fields(cls)]
        if isinstance(values, dict):
            return cls(**{n: values[n] for n in names if n in values})
        return cls(**{n: getattr(values, n) for n in names if hasattr(values, n)})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def caps(self) -> Caps:
        """The limits above, as the handlers apply them to a client's operation."""
        return Caps(self.max_ids_per_call, self.max_tokens_per_request, self.max_requests)


@dataclass(frozen=True)
class Caps:
    """What one operation may ask for: ids in one call, tokens of one
    request, requests running.  An untrusted client's operations (REST, a
    trace, the demo) get the configuration's (``RuntimeConfig.caps``); an
    operation the engine itself did (a mirror's stream) or one the writer
    already accepted (a recording's replay, the dry-run journal) gets
    ``UNCAPPED``: its shape and ranges are still checked, its size is not."""

    max_ids_per_call: int
    max_tokens_per_request: int
    max_requests: int


UNCAPPED = Caps(2**62, 2**62, 2**62)
