"""How much of a prompt would hit the cache (a read): the record and its handler."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from blockpool.common.shapes import TypedDict, shape
from blockpool.runtime.ops.base import OpRecord, OpSpec, Outcome, RuntimeState, check_tokens
from blockpool.runtime.ops.fields import ExtraKey, TokenId


@shape
class PrefixLookup(TypedDict):
    """How much of the prompt would hit the cache now."""

    num_tokens: int
    num_hit_tokens: int
    num_hit_blocks: int


class PrefixLookupOp(OpRecord[PrefixLookup], kw_only=True):
    """How many leading tokens of a prompt would hit the cache now."""

    op: Literal["prefix_lookup"] = "prefix_lookup"
    token_ids: Annotated[list[TokenId], msgspec.Meta(min_length=1)]
    lora_name: ExtraKey | None = None
    cache_salt: ExtraKey | None = None


def prefix_lookup(rt: RuntimeState, op: PrefixLookupOp) -> Outcome[PrefixLookup]:
    check_tokens(rt, len(op.token_ids), "prefix_lookup")
    hit_tokens = rt.manager.lookup(op.token_ids, lora_name=op.lora_name, cache_salt=op.cache_salt)
    result: PrefixLookup = {
        "num_tokens": len(op.token_ids),
        "num_hit_tokens": hit_tokens,
        "num_hit_blocks": hit_tokens // rt.manager.block_size,
    }
    return result, None


SPEC = OpSpec(PrefixLookupOp, prefix_lookup, None)
