"""Index checks shared by the storage operations.

Every check runs before anything is written, with at most one device sync
per operation (the statistics are stacked and read back together).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blockpool.storage.config import StorageError

IndexLike = Sequence[int] | torch.Tensor

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def to_index(values: IndexLike, device: torch.device, what: str) -> torch.Tensor:
    """A 1-D int64 tensor on ``device`` from a sequence of ints or an integer tensor."""
    if isinstance(values, torch.Tensor):
        tensor = values
    else:
        try:
            tensor = torch.as_tensor(values) if len(values) else torch.empty(0, dtype=torch.int64)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise StorageError(f"{what} must be a sequence of ints ({exc})") from None
    if tensor.dtype not in _INT_DTYPES:
        raise StorageError(f"{what} must hold integers, got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise StorageError(f"{what} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.to(device=device, dtype=torch.int64)


def check_index(index: torch.Tensor, upper: int, what: str, *, unique: bool = False) -> None:
    """Every value in ``[0, upper)`` and, with ``unique``, none repeated."""
    if index.numel() == 0:
        return
    lo, hi = torch.aminmax(index)
    parts = [lo, hi]
    if unique:
        parts.append(count_repeats(index))
    stats = torch.stack(parts).tolist()
    if stats[0] < 0 or stats[1] >= upper:
        bad = index[(index < 0) | (index >= upper)]
        raise StorageError(
            f"{what} must lie in [0, {upper}); got {bad[:8].tolist()}"
            f"{' ...' if bad.numel() > 8 else ''}"
        )
    if unique and stats[2]:
        raise StorageError(f"{what} repeats {stats[2]} value(s); each may appear once")


def count_repeats(index: torch.Tensor) -> torch.Tensor:
    """How many entries equal their predecessor once sorted (a 0-d tensor)."""
    ordered = torch.sort(index).values
    return (ordered[1:] == ordered[:-1]).sum()


def check_count(value: object, what: str, upper: int) -> int:
    """A non-negative int no larger than ``upper``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StorageError(f"{what} must be a non-negative int, got {value!r}")
    if value > upper:
        raise StorageError(f"{what} must be at most {upper}, got {value}")
    return value
