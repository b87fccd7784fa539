"""Operation bodies: the same models serve the REST endpoints and /batch.

Shapes are checked here (pydantic); limits that come from settings and
everything that depends on the pool's state are checked by the engine before
it changes anything.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blockpool.runtime import ops as rops

HexHash = Annotated[
    str,
    Field(
        pattern=r"^(?:[0-9a-fA-F]{2}){1,64}$",
        description="a block hash as hex (the raw digest, e.g. 64 hex digits for sha256)",
        examples=["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"],
    ),
]
BlockId = Annotated[int, Field(ge=0, le=2**31 - 1)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
GroupId = Annotated[int, Field(ge=0, le=2**31 - 1)]
RequestId = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
ExtraKey = Annotated[str, Field(min_length=1, max_length=200)]


class _Op(BaseModel):
    # strict: a JSON string or boolean is not silently taken for a number
    # ({"num_blocks": true} would otherwise allocate one block).
    model_config = ConfigDict(extra="forbid", strict=True)


class AllocateOp(_Op):
    """get_new_blocks(num_blocks): blocks from the queue's head, ref count 1."""

    op: Literal["allocate"] = "allocate"
    num_blocks: int = Field(ge=0, le=2**31 - 1, examples=[4])


class FreeOp(_Op):
    """free_blocks(ordered): the first id is evicted first (free a chain in reverse)."""

    op: Literal["free"] = "free"
    block_ids: list[BlockId] = Field(examples=[[3, 2, 1]])


class TouchOp(_Op):
    """touch(blocks): one more reference each (a free block leaves the queue)."""

    op: Literal["touch"] = "touch"
    block_ids: list[BlockId] = Field(examples=[[1, 2]])


class CacheOp(_Op):
    """cache_full_blocks: make held blocks reachable by hash.

    Give ``token_ids`` (block_size per block; hashes are chained from
    ``parent_block_hash``, with ``lora_name`` / ``cache_salt`` as extra keys)
    or precomputed ``block_hashes`` (one per block)."""

    op: Literal["cache"] = "cache"
    block_ids: list[BlockId] = Field(min_length=1, examples=[[1, 2]])
    token_ids: list[TokenId] | None = None
    block_hashes: list[HexHash] | None = None
    parent_block_hash: HexHash | None = None
    group_id: GroupId = 0
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class LookupOp(_Op):
    """get_cached_block(hash, group_ids): one block per group, or a miss."""

    op: Literal["lookup"] = "lookup"
    block_hash: HexHash
    group_ids: list[GroupId] = Field(default_factory=lambda: [0], min_length=1, max_length=64)


class PrefixLookupOp(_Op):
    """How many leading tokens of a prompt would hit the cache now."""

    op: Literal["prefix_lookup"] = "prefix_lookup"
    token_ids: list[TokenId] = Field(min_length=1)
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class EvictOp(_Op):
    """evict_blocks(ids): drop cached hashes; held blocks stay held."""

    op: Literal["evict"] = "evict"
    block_ids: list[BlockId] = Field(examples=[[5]])


class ResetOp(_Op):
    """reset_prefix_cache(): refused while any block is held."""

    op: Literal["reset"] = "reset"


class AdmitOp(_Op):
    """Admit a request: prefix hit, allocation, caching of its full blocks."""

    op: Literal["admit"] = "admit"
    request_id: RequestId | None = None
    token_ids: list[TokenId] = Field(min_length=1, examples=[[1, 2, 3, 4, 5, 6, 7, 8, 9]])
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


class AppendOp(_Op):
    """Append decode tokens to a running request."""

    op: Literal["append"] = "append"
    request_id: RequestId
    token_ids: list[TokenId] = Field(min_length=1, examples=[[10, 11]])


class FinishOp(_Op):
    """Finish a request: its blocks are freed in reverse."""

    op: Literal["finish"] = "finish"
    request_id: RequestId


Op = Annotated[
    AllocateOp
    | FreeOp
    | TouchOp
    | CacheOp
    | LookupOp
    | PrefixLookupOp
    | EvictOp
    | ResetOp
    | AdmitOp
    | AppendOp
    | FinishOp,
    Field(discriminator="op"),
]


class BatchRequest(_Op):
    """Many operations in one call, applied in order.  ``on_error``:
    ``rollback`` (default): all or nothing -- when any operation would be
    refused, the batch changes nothing and the refusal is the answer;
    ``stop``: apply up to the first refused operation, skip the rest;
    ``continue``: apply every operation that can be applied.
    All or nothing costs about twice the operations themselves (a dry run on
    a spare kept in step; bench/bench_batch_atomic.py)."""

    ops: list[Op] = Field(min_length=1)
    on_error: Literal["rollback", "stop", "continue"] = "rollback"


class AppendBody(_Op):
    token_ids: list[TokenId] = Field(min_length=1, examples=[[10, 11]])


class DemoConfig(_Op):
    """Demo workload settings; omitted fields keep their value."""

    rate: float | None = Field(default=None, ge=0, le=500, description="requests per second")
    mix: dict[str, float] | None = Field(
        default=None,
        description="relative weights of chat, conversation, document, noise",
        examples=[{"chat": 4, "conversation": 3, "document": 2, "noise": 1}],
    )
    decode_tokens: tuple[int, int] | None = Field(
        default=None,
        strict=False,  # a JSON array (strict would want a Python tuple); items stay strict
        description="min and max decode tokens per request",
    )
    max_running: int | None = Field(default=None, ge=1, le=100_000)


_RUNTIME: dict[type, type[Any]] = {
    AllocateOp: rops.AllocateOp,
    FreeOp: rops.FreeOp,
    TouchOp: rops.TouchOp,
    CacheOp: rops.CacheOp,
    LookupOp: rops.LookupOp,
    PrefixLookupOp: rops.PrefixLookupOp,
    EvictOp: rops.EvictOp,
    ResetOp: rops.ResetOp,
    AdmitOp: rops.AdmitOp,
    AppendOp: rops.AppendOp,
    FinishOp: rops.FinishOp,
}


def to_runtime(op: Any) -> Any:
    """A validated operation body as the runtime's operation (runtime
    operations pass through unchanged)."""
    cls = _RUNTIME.get(type(op))
    return op if cls is None else cls(**op.__dict__)
