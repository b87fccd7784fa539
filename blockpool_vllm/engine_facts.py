"""What the mirror must know about an engine, and what it cannot follow.

Pure functions of plain values (no vLLM import): the scheduler subclass
passes what it read from vLLM's config, tests pass their own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from blockpool.core.free_order import APPEND_ALL, UNCACHED_FIRST, FreeOrder
from blockpool.mirror.protocol import Group

# What the follower has been tested against: 0.16.x frees every block to the
# queue's tail; from 0.24 on, blocks without a hash go to its head.
KNOWN_APPEND = ((0, 16),)
UNCACHED_FIRST_SINCE = (0, 24)
FULL_ATTENTION = "FullAttentionSpec"


def version_tuple(version: str) -> tuple[int, int] | None:
    m = re.match(r"^(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def free_order_for(version: str) -> FreeOrder | None:
    """blockpool's free order for this vLLM version (None: not known)."""
    vt = version_tuple(version)
    if vt is None:
        return None
    if vt in KNOWN_APPEND:
        return APPEND_ALL
    if vt >= UNCACHED_FIRST_SINCE:
        return UNCACHED_FIRST
    return None


def problems_of(
    version: str,
    groups: Sequence[Group],
    *,
    enable_caching: bool,
    block_size: int,
    hash_block_size: int,
    kv_connector: str | None,
    hash_fn: str,
) -> list[str]:
    """Everything that keeps the mirror from being exact (empty: exact)."""
    out: list[str] = []
    if free_order_for(version) is None:
        out.append(
            f"vLLM {version}: its free order is not known to the mirror "
            "(followed: 0.16.x, and >= 0.24)"
        )
    if not enable_caching:
        out.append("prefix caching is off (--enable-prefix-caching)")
    if len(groups) != 1:
        out.append(f"{len(groups)} KV-cache groups (hybrid models): the mirror follows one")
    out.extend(
        f"group {g.group_id} is {g.kind}: the mirror follows full attention only"
        for g in groups
        if g.kind != FULL_ATTENTION
    )
    if block_size != hash_block_size:
        out.append(f"block size {block_size} is not the hash block size {hash_block_size}")
    if kv_connector:
        out.append(f"a KV connector ({kv_connector}) moves blocks the mirror does not see")
    if hash_fn not in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"):
        out.append(f"hash function {hash_fn!r}: the mirror's lookups cannot hash like it")
    return out


def served_model(vllm_config: object) -> str | None:
    """The model name the engine serves (its ``--served-model-name``, else
    ``--model``), for the mirror's ``model_name`` label; None if it says none."""
    mc = getattr(vllm_config, "model_config", None)
    for name in (getattr(mc, "served_model_name", None), getattr(mc, "model", None)):
        if isinstance(name, (list, tuple)):
            name = name[0] if name else None
        if isinstance(name, str) and name:
            return name[:200]
    return None
