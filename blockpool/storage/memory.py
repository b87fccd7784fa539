"""Memory facts for the service: what the storage holds and where the bytes go.

Plain dataclasses of ints and strings (``as_dict`` for JSON).  The engine
counts blocks from the pool (in use, cached and evictable, empty); storage
turns the counts into bytes without knowing anything of ref counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from blockpool.storage.layout import StorageError


@dataclass(frozen=True)
class MemoryFacts:
    """The storage's device, dtype, geometry and bytes."""

    device: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_blocks: int
    bytes_per_block: int
    bytes_allocated: int

    def as_dict(self) -> dict[str, int | str]:
        return dict(asdict(self))


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes holding live (in use), cached (free but still reachable by hash)
    and empty blocks; ``other_bytes`` covers blocks in none of the three
    (the null block, for one)."""

    live_bytes: int
    cached_bytes: int
    empty_bytes: int
    other_bytes: int
    total_bytes: int

    def as_dict(self) -> dict[str, int]:
        return dict(asdict(self))


def memory_breakdown(
    facts: MemoryFacts, *, num_in_use: int, num_cached: int, num_empty: int
) -> MemoryBreakdown:
    """Bytes per category for the given block counts, which must be
    non-negative ints adding up to at most ``facts.num_blocks``."""
    counts = {"num_in_use": num_in_use, "num_cached": num_cached, "num_empty": num_empty}
    for name, value in counts.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StorageError(f"{name} must be a non-negative int, got {value!r}")
    total = num_in_use + num_cached + num_empty
    if total > facts.num_blocks:
        raise StorageError(
            f"{total} blocks counted ({counts}) but the storage holds {facts.num_blocks}"
        )
    per = facts.bytes_per_block
    return MemoryBreakdown(
        live_bytes=num_in_use * per,
        cached_bytes=num_cached * per,
        empty_bytes=num_empty * per,
        other_bytes=(facts.num_blocks - total) * per,
        total_bytes=facts.num_blocks * per,
    )
