"""What the K/V memory looks like: its shape, device, dtype and size.

``KVCacheShape`` fixes one block's geometry; ``resolve_device`` and
``resolve_dtype`` turn user choices into torch objects (CUDA when available,
CPU otherwise); ``plan_cache`` derives the block count from an explicit count,
a byte budget or a fraction of the device's free memory, as vLLM sizes
``num_gpu_blocks``.  Bad choices raise ``StorageError`` (a ``ValueError``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import torch

from blockpool.core.errors import BlockPoolError

DeviceLike = str | torch.device | None
DtypeLike = str | torch.dtype | None

_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
}
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class StorageError(BlockPoolError, ValueError):
    """A bad storage configuration or a bad storage operation; nothing changed."""


def positive_int(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise StorageError(f"{name} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class KVCacheShape:
    """One KV-cache group's geometry: every layer holds K and V for each block."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            positive_int(name, value)

    def bytes_per_block(self, dtype: torch.dtype) -> int:
        """2 (K and V) * block_size * num_kv_heads * head_size * dtype size * num_layers."""
        item = dtype.itemsize
        return 2 * self.block_size * self.num_kv_heads * self.head_size * item * self.num_layers


def resolve_device(device: DeviceLike = None) -> torch.device:
    """``None`` picks CUDA when available, else CPU.  Asking for CUDA where
    there is none, a missing CUDA index or another device type is an error."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise StorageError(f"not a device: {device!r} ({exc})") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise StorageError(f"storage runs on 'cpu' or 'cuda', not {dev.type!r}")
    if not torch.cuda.is_available():
        raise StorageError(
            f"device {str(dev)!r} requested but CUDA is not available "
            f"(torch {torch.__version__}); use 'cpu' or leave the device unset"
        )
    index = torch.cuda.current_device() if dev.index is None else dev.index
    count = torch.cuda.device_count()
    if not 0 <= index < count:
        raise StorageError(f"CUDA device {index} requested but only {count} are visible")
    return torch.device("cuda", index)


def resolve_dtype(dtype: DtypeLike, device: torch.device) -> torch.dtype:
    """``None`` picks float16 on CUDA (half the bytes of float32: twice the
    blocks, as real KV caches) and float32 on CPU (where half-precision math
    is slow or emulated and memory is not the limit)."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        found = _DTYPES.get(dtype.lower().removeprefix("torch."))
        if found is None:
            raise StorageError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        return found
    if dtype not in SUPPORTED_DTYPES:
        raise StorageError(f"unsupported dtype {dtype}; choose one of {SUPPORTED_DTYPES}")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``"float16"``."""
    return str(dtype).removeprefix("torch.")


def free_device_bytes(device: torch.device) -> int:
    """Free memory on the device now: CUDA's ``mem_get_info``, or the host's
    available physical pages for CPU."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class CachePlan:
    """How many blocks the storage holds and what they cost."""

    device: str
    dtype: str
    num_blocks: int
    bytes_per_block: int
    total_bytes: int
    budget_bytes: int
    sized_by: str  # "num_blocks", "budget_bytes" or "memory_fraction"

    def as_dict(self) -> dict[str, int | str]:
        return dict(asdict(self))


def plan_cache(
    shape: KVCacheShape,
    *,
    device: DeviceLike = None,
    dtype: DtypeLike = None,
    num_blocks: int | None = None,
    budget_bytes: int | None = None,
    memory_fraction: float | None = None,
    free_bytes: int | None = None,
) -> CachePlan:
    """Size the storage from exactly one of ``num_blocks``, ``budget_bytes``
    or ``memory_fraction`` (of the device's free memory, or of ``free_bytes``
    when given).  The block count is ``budget // bytes_per_block``, at least 1."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    per_block = shape.bytes_per_block(dt)
    chosen = [n for n, v in _sizing_args(num_blocks, budget_bytes, memory_fraction) if v]
    if len(chosen) != 1:
        raise StorageError(
            f"give exactly one of num_blocks, budget_bytes, memory_fraction; got {chosen or 'none'}"
        )
    if num_blocks is not None:
        count = positive_int("num_blocks", num_blocks)
        budget = count * per_block
    else:
        budget = _budget(budget_bytes, memory_fraction, free_bytes, dev)
        count = budget // per_block
        if count < 1:
            raise StorageError(
                f"a budget of {budget} bytes holds no block of {per_block} bytes "
                f"({shape}, {dtype_name(dt)})"
            )
    return CachePlan(
        str(dev), dtype_name(dt), count, per_block, count * per_block, budget, chosen[0]
    )


def _sizing_args(
    num_blocks: int | None, budget_bytes: int | None, memory_fraction: float | None
) -> list[tuple[str, bool]]:
    return [
        ("num_blocks", num_blocks is not None),
        ("budget_bytes", budget_bytes is not None),
        ("memory_fraction", memory_fraction is not None),
    ]


def _budget(
    budget_bytes: int | None,
    memory_fraction: float | None,
    free_bytes: int | None,
    device: torch.device,
) -> int:
    if budget_bytes is not None:
        return positive_int("budget_bytes", budget_bytes)
    fraction = memory_fraction
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise StorageError(f"memory_fraction must be a number, got {fraction!r}")
    if not 0.0 < fraction <= 1.0:
        raise StorageError(f"memory_fraction must be in (0, 1], got {fraction!r}")
    if free_bytes is None:
        free_bytes = free_device_bytes(device)
    elif isinstance(free_bytes, bool) or not isinstance(free_bytes, int) or free_bytes < 0:
        raise StorageError(f"free_bytes must be a non-negative int, got {free_bytes!r}")
    return int(free_bytes * fraction)
