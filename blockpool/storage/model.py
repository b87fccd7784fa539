"""A deterministic stand-in model: (token id, position, layer) -> K/V.

No weights: each element of K and V is a seeded integer hash of the token
id, its position, the layer, K-or-V, the head and the channel, mapped to
[-1, 1).  Computed with vectorized int64 torch ops on the storage's device
(every intermediate stays below 2**62, so nothing overflows), then cast to
the storage dtype, so cached content can be recomputed and compared bit for
bit.  ``queries`` makes attention queries the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blockpool.storage.layout import KVCacheShape, StorageError

TokenIds = Sequence[int] | torch.Tensor

_MASK = (1 << 31) - 1
_MUL = 0x045D9F3B  # < 2**27: a 31-bit value times it stays below 2**58
_TOKEN, _POSITION, _SEED = 0x2F0B3A49, 0x1B873593, 0x68E31DA4
_QUERY_SALT = 0x51ED270B


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer avalanche (two xor-shift-multiply rounds)."""
    x = ((x ^ (x >> 16)) * _MUL) & _MASK
    x = ((x ^ (x >> 15)) * _MUL) & _MASK
    return x ^ (x >> 16)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """31-bit ints -> float32 in [-1, 1)."""
    return x.to(torch.float32) * (2.0 / (1 << 31)) - 1.0


def _as_ids(values: TokenIds, device: torch.device, what: str) -> torch.Tensor:
    tensor = torch.as_tensor(values, device=device)
    if tensor.numel() == 0:
        tensor = tensor.to(torch.int64)
    if tensor.dim() != 1 or tensor.is_floating_point() or tensor.dtype == torch.bool:
        raise StorageError(f"{what} must be a 1-D sequence of ints, got {tensor.dtype}")
    return tensor.to(torch.int64)


class StandInModel:
    """Deterministic K/V (and queries) for a ``KVCacheShape``; ``seed`` picks the model."""

    def __init__(self, shape: KVCacheShape, *, seed: int = 0) -> None:
        self.shape = shape
        self.seed = seed & _MASK

    def _token_hash(
        self,
        token_ids: TokenIds,
        positions: TokenIds,
        device: torch.device,
        salt: int,
    ) -> torch.Tensor:
        tokens = _as_ids(token_ids, device, "token ids")
        pos = _as_ids(positions, device, "positions")
        if tokens.shape != pos.shape:
            raise StorageError(f"{tokens.numel()} token ids but {pos.numel()} positions")
        seed = _mix(torch.tensor((self.seed ^ salt) & _MASK, device=device))
        x = _mix((tokens & _MASK) * _TOKEN & _MASK ^ seed)
        return _mix((x + ((pos & _MASK) * _POSITION & _MASK)) & _MASK ^ _SEED)

    def kv(
        self,
        token_ids: TokenIds,
        positions: TokenIds,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """K/V of every layer: ``[num_layers, 2, T, num_kv_heads, head_size]``."""
        s = self.shape
        tok = self._token_hash(token_ids, positions, device, 0)
        coords = torch.arange(s.num_layers * 2 * s.num_kv_heads * s.head_size, device=device).view(
            s.num_layers, 2, 1, s.num_kv_heads, s.head_size
        )
        coord_hash = _mix((coords * _MUL + self.seed) & _MASK)
        x = _mix(tok.view(1, 1, -1, 1, 1) ^ coord_hash)
        return _unit(x).to(dtype)

    def queries(
        self,
        token_ids: TokenIds,
        positions: TokenIds,
        *,
        layer: int,
        num_heads: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """Queries of one layer: ``[T, num_heads, head_size]``."""
        s = self.shape
        if not 0 <= layer < s.num_layers:
            raise StorageError(f"layer must be in [0, {s.num_layers}), got {layer}")
        tok = self._token_hash(token_ids, positions, device, _QUERY_SALT + layer)
        coords = torch.arange(num_heads * s.head_size, device=device).view(
            1, num_heads, s.head_size
        )
        x = _mix(tok.view(-1, 1, 1) ^ _mix((coords * _MUL + layer) & _MASK))
        return _unit(x).to(dtype)
