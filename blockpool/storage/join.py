"""The join between pool and storage, by block id only (vLLM's scheduler /
worker split): write the K/V of a request's just-computed tokens through its
block table, and verify that its blocks hold exactly the K/V the stand-in
model computes for its tokens.

Typical engine use with a ``RequestManager``::

    adm = manager.admit(rid, tokens)
    write_request_tokens(storage, model, adm.block_ids[0], tokens,
                         adm.num_computed_tokens)          # the uncached rest
    manager.append_tokens(rid, [tok]); tokens.append(tok)
    write_request_tokens(storage, model, manager.get(rid).block_ids()[0],
                         tokens, len(tokens) - 1)          # one decode token
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from blockpool.storage._index import IndexLike, check_count
from blockpool.storage.model import StandInModel, TokenIds
from blockpool.storage.tensors import KVCacheStorage

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Verification:
    """Outcome of ``verify_request``: the blocks (in block-table order) whose
    content differs from the model's, and the first differing token/slot."""

    ok: bool
    num_tokens: int
    bad_block_ids: list[int]
    first_bad_token: int | None
    first_bad_slot: int | None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _positions(start: int, end: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, end, device=device)


def expected_kv(
    storage: KVCacheStorage, model: StandInModel, token_ids: TokenIds, start: int, end: int
) -> torch.Tensor:
    """What the model computes for tokens ``start .. end-1``, in the storage's dtype."""
    return model.kv(
        token_ids[start:end],
        _positions(start, end, storage.device),
        device=storage.device,
        dtype=storage.dtype,
    )


def write_request_tokens(
    storage: KVCacheStorage,
    model: StandInModel,
    block_ids: IndexLike,
    token_ids: TokenIds,
    start: int,
    end: int | None = None,
) -> int:
    """Compute and store the K/V of tokens ``start .. end-1`` (``end``
    defaults to all tokens) of a request with this block table.  Returns the
    number of tokens written; raises ``StorageError`` before writing when the
    range or the block table is bad."""
    end = len(token_ids) if end is None else check_count(end, "end", len(token_ids))
    slots = storage.slot_mapping(block_ids, start, end)
    if slots.numel():
        storage.write(slots, expected_kv(storage, model, token_ids, start, end))
    return end - start


def verify_request(
    storage: KVCacheStorage,
    model: StandInModel,
    block_ids: IndexLike,
    token_ids: TokenIds,
    num_tokens: int | None = None,
) -> Verification:
    """Check bit for bit that the first ``num_tokens`` tokens (default all)
    of a request hold the model's K/V in every layer."""
    n = (
        len(token_ids)
        if num_tokens is None
        else check_count(num_tokens, "num_tokens", len(token_ids))
    )
    table = list(block_ids.tolist() if isinstance(block_ids, torch.Tensor) else block_ids)
    got = storage.gather(table, n)
    want = expected_kv(storage, model, token_ids, 0, n)
    bits = _BITS[storage.dtype.itemsize]
    differs = (got.view(bits) != want.view(bits)).any(dim=(0, 1, 3, 4))
    bad_tokens = torch.nonzero(differs).flatten().tolist()
    if not bad_tokens:
        return Verification(True, n, [], None, None)
    size = storage.block_size
    bad_blocks = [table[i] for i in sorted({t // size for t in bad_tokens})]
    first = bad_tokens[0]
    return Verification(False, n, bad_blocks, first, table[first // size] * size + first % size)
