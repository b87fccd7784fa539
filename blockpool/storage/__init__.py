"""Torch-backed K/V memory joined to the pool by block id.

The only part of blockpool that imports torch (``import blockpool`` does
not import this package).  Storage is indexed by block id and slot
(``block_id * block_size + offset``) and knows nothing of ref counts; the
pool knows nothing of tensors; the engine joins them::

    from blockpool import BlockPool, RequestManager
    from blockpool.storage import (KVCacheShape, KVCacheStorage, StandInModel,
                                   plan_cache, write_request_tokens, verify_request)

    shape = KVCacheShape(num_layers=4, num_kv_heads=2, head_size=64, block_size=16)
    plan = plan_cache(shape, memory_fraction=0.5)      # or num_blocks= / budget_bytes=
    storage = KVCacheStorage.from_plan(shape, plan)    # CUDA when available, else CPU
    pool = BlockPool(plan.num_blocks, enable_caching=True, hash_block_size=16)
    manager, model = RequestManager(pool), StandInModel(shape, seed=0)

    adm = manager.admit("a", tokens)
    write_request_tokens(storage, model, adm.block_ids[0], tokens, adm.num_computed_tokens)
    assert verify_request(storage, model, adm.block_ids[0], tokens).ok
"""

from blockpool.storage.attention import attention, paged_attention
from blockpool.storage.join import (
    Verification,
    expected_kv,
    verify_request,
    write_request_tokens,
)
from blockpool.storage.layout import (
    SUPPORTED_DTYPES,
    CachePlan,
    KVCacheShape,
    StorageError,
    dtype_name,
    free_device_bytes,
    plan_cache,
    resolve_device,
    resolve_dtype,
)
from blockpool.storage.memory import MemoryBreakdown, MemoryFacts, memory_breakdown
from blockpool.storage.model import StandInModel
from blockpool.storage.tensors import KVCacheStorage

__all__ = [
    "SUPPORTED_DTYPES",
    "CachePlan",
    "KVCacheShape",
    "KVCacheStorage",
    "MemoryBreakdown",
    "MemoryFacts",
    "StandInModel",
    "StorageError",
    "Verification",
    "attention",
    "dtype_name",
    "expected_kv",
    "free_device_bytes",
    "memory_breakdown",
    "paged_attention",
    "plan_cache",
    "resolve_device",
    "resolve_dtype",
    "verify_request",
    "write_request_tokens",
]
