"""blockpool: a faithful, fast re-implementation of vLLM 0.16's paged KV-cache
block pool, with the checks and views an operator needs.

The vLLM-compatible names are importable from here.  ``blockpool.storage``
(torch-backed K/V memory) is imported on its own, so that this package needs
no torch.
"""

from __future__ import annotations

from typing import Any

from blockpool.core import hashing as _hashing
from blockpool.core.block import KVCacheBlock
from blockpool.core.block_hasher import (
    generate_block_hash_extra_keys,
    get_request_block_hasher,
    need_extra_keys,
)
from blockpool.core.errors import (
    BlockPoolError,
    DoubleFreeError,
    DuplicateRequestError,
    ManagerError,
    NotEnoughBlocksError,
    NullBlockError,
    PoolAssertionError,
    RequestFinishedError,
    StrictModeError,
    UnknownBlockError,
    UnknownRequestError,
)
from blockpool.core.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
    decode_event_batch,
    encode_event_batch,
)
from blockpool.core.free_queue import FreeKVCacheBlockQueue
from blockpool.core.hash_map import BlockHashToBlockMap
from blockpool.core.hashing import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    get_hash_fn_by_name,
    get_none_hash,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    set_int_block_hashes,
    sha256,
    sha256_cbor,
    xxhash,
    xxhash_cbor,
)
from blockpool.core.invariants import InvariantError, check_invariants
from blockpool.core.manager import Admission, ManagedRequest, PrefixCacheStats, RequestManager
from blockpool.core.metrics import BlockMetricsState, KVCacheEvictionEvent, KVCacheMetricsCollector
from blockpool.core.pool import BlockPool
from blockpool.core.request import LoRARequest, MultiModalFeature, PlaceholderRange, Request

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # NONE_HASH changes with init_none_hash: always hand out the current one.
    if name == "NONE_HASH":
        return _hashing.get_none_hash()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MEDIUM_GPU",
    "NONE_HASH",
    "Admission",
    "AllBlocksCleared",
    "BlockHash",
    "BlockHashList",
    "BlockHashListWithBlockSize",
    "BlockHashToBlockMap",
    "BlockHashWithGroupId",
    "BlockMetricsState",
    "BlockPool",
    "BlockPoolError",
    "BlockRemoved",
    "BlockStored",
    "DoubleFreeError",
    "DuplicateRequestError",
    "EventBatch",
    "ExternalBlockHash",
    "FreeKVCacheBlockQueue",
    "InvariantError",
    "KVCacheBlock",
    "KVCacheEvent",
    "KVCacheEvictionEvent",
    "KVCacheMetricsCollector",
    "KVEventBatch",
    "LoRARequest",
    "ManagedRequest",
    "ManagerError",
    "MultiModalFeature",
    "NotEnoughBlocksError",
    "NullBlockError",
    "PlaceholderRange",
    "PoolAssertionError",
    "PrefixCacheStats",
    "Request",
    "RequestFinishedError",
    "RequestManager",
    "StrictModeError",
    "UnknownBlockError",
    "UnknownRequestError",
    "check_invariants",
    "decode_event_batch",
    "encode_event_batch",
    "generate_block_hash_extra_keys",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn_by_name",
    "get_none_hash",
    "get_request_block_hasher",
    "hash_block_tokens",
    "init_none_hash",
    "make_block_hash_with_group_id",
    "maybe_convert_block_hash",
    "need_extra_keys",
    "set_int_block_hashes",
    "sha256",
    "sha256_cbor",
    "xxhash",
    "xxhash_cbor",
]
