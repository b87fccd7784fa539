"""Shadow pools: what the same request stream would do to other pools.

``ShadowPool`` replays request-level accesses (admit with the prompt's block
hashes, decode growth, finish, reset) over metadata only, under a free-order
``FreePolicy``: vLLM 0.16.0's append-all, later vLLM's uncached-first, or
S3-FIFO.  ``ShadowSet`` drives several at once from one access batch.  Pure
Python: no I/O, no threads; the service decides where they run.
"""

from __future__ import annotations

from blockpool.shadow.free_policy import FreePolicy
from blockpool.shadow.policies import OLD_POLICY_NAMES, POLICY_NAMES, make_policy, policy_name
from blockpool.shadow.pool import ShadowPool, ShadowStats, make_shadow
from blockpool.shadow.s3fifo import S3FIFO
from blockpool.shadow.set import Access, ShadowSet, ShadowSpec
from blockpool.shadow.vllm_orders import AppendAll, UncachedFirst

__all__ = [
    "OLD_POLICY_NAMES",
    "POLICY_NAMES",
    "S3FIFO",
    "Access",
    "AppendAll",
    "FreePolicy",
    "ShadowPool",
    "ShadowSet",
    "ShadowSpec",
    "ShadowStats",
    "UncachedFirst",
    "make_policy",
    "make_shadow",
    "policy_name",
]
