"""Index checks shared by the storage operations.

Checks run before anything is written, on the device the index came on:
Python sequences are checked on the host (no device sync); device tensors
cost one sync, all statistics stacked and read back together.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from blockpool.storage.layout import StorageError

IndexLike = Sequence[int] | torch.Tensor

_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def as_index(values: IndexLike, what: str) -> torch.Tensor:
    """A 1-D int64 tensor from a sequence of ints (on the CPU) or an integer
    tensor (on its own device)."""
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
    return tensor.to(torch.int64)


def checked_index(
    values: IndexLike,
    what: str,
    upper: int,
    *,
    unique: bool = False,
    exclude: torch.Tensor | None = None,
) -> torch.Tensor:
    """``as_index(values)`` with every value in ``[0, upper)``; with
    ``unique`` none repeated; none in ``exclude`` (same device) if given."""
    index = as_index(values, what)
    if index.numel() == 0:
        return index
    lo, hi = torch.aminmax(index)
    parts = [lo, hi]
    if unique:
        ordered = torch.sort(index).values
        parts.append((ordered[1:] == ordered[:-1]).sum())
    if exclude is not None:
        parts.append(torch.isin(index, exclude.to(index.device)).sum())
    stats = torch.stack(parts).tolist()
    if stats[0] < 0 or stats[1] >= upper:
        bad = index[(index < 0) | (index >= upper)]
        raise StorageError(
            f"{what} must lie in [0, {upper}); got {bad[:8].tolist()}"
            f"{' ...' if bad.numel() > 8 else ''}"
        )
    if unique and stats[2]:
        raise StorageError(f"{what} repeat {stats[2]} value(s); each may appear once")
    if exclude is not None and stats[-1]:
        raise StorageError(f"{stats[-1]} of the {what} also appear among the sources")
    return index


def check_count(value: object, what: str, upper: int) -> int:
    """A non-negative int no larger than ``upper``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StorageError(f"{what} must be a non-negative int, got {value!r}")
    if value > upper:
        raise StorageError(f"{what} must be at most {upper}, got {value}")
    return value
