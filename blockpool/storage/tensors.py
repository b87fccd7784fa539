"""KVCacheStorage: the K/V tensors of every layer, addressed by block id and slot.

Layout.  One zero-filled buffer ``[num_layers, 2, num_blocks, block_size,
num_kv_heads, head_size]``; ``layer(i)`` is layer i's view in vLLM's paged
layout ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V).
Token ``slot = block_id * block_size + offset``.  Storage knows nothing of
ref counts or hashes: the pool hands out block ids, the engine joins them.

Speed.  Every operation is one indexed kernel over all layers (no Python
loop per token, layer or block; block copies take two kernels per
scratch-sized chunk): the buffer is also seen as rows, one per
(layer, K/V, slot) or (layer, K/V, block), and those rows are reinterpreted
as the widest element type dividing a row (16-byte complex128 where
possible).  Indexed kernels move one element per index step, so wide
elements cut their work by up to 8x for float16; bits are copied, never
converted.  Block copies go through a small scratch buffer, chunk by chunk,
so the second pass reads from cache.

Errors.  Bad ids, shapes, dtypes or devices raise ``StorageError`` before
anything is written.
"""

from __future__ import annotations

import torch

from blockpool.storage._index import IndexLike, as_index, check_count, checked_index
from blockpool.storage.layout import (
    CachePlan,
    DeviceLike,
    DtypeLike,
    KVCacheShape,
    StorageError,
    dtype_name,
    positive_int,
    resolve_device,
    resolve_dtype,
)
from blockpool.storage.memory import MemoryBreakdown, MemoryFacts, memory_breakdown

_WIDE = ((torch.complex128, 16), (torch.int64, 8), (torch.int32, 4), (torch.int16, 2))
_COPY_CHUNK_BYTES = {"cpu": 4 << 20, "cuda": 64 << 20}


def _wide_dtype(row_bytes: int) -> torch.dtype:
    for dtype, size in _WIDE:
        if row_bytes % size == 0:
            return dtype
    return torch.uint8


class KVCacheStorage:
    """K/V memory for ``num_blocks`` blocks of one KV-cache group.

    ``device``/``dtype`` as ``resolve_device``/``resolve_dtype``;
    ``copy_chunk_bytes`` sizes the scratch buffer ``copy_blocks`` streams
    through (default 4 MiB on CPU, 64 MiB on CUDA: cache-sized)."""

    def __init__(
        self,
        shape: KVCacheShape,
        num_blocks: int,
        *,
        device: DeviceLike = None,
        dtype: DtypeLike = None,
        copy_chunk_bytes: int | None = None,
    ) -> None:
        self.shape = shape
        self.num_blocks = positive_int("num_blocks", num_blocks)
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.block_size = shape.block_size
        self.num_slots = self.num_blocks * self.block_size
        lay, heads, size = shape.num_layers, shape.num_kv_heads, shape.head_size
        self.buffer = torch.zeros(
            (lay, 2, self.num_blocks, self.block_size, heads, size),
            dtype=self.dtype,
            device=self.device,
        )
        self._planes = 2 * lay
        row = heads * size
        self._wide = _wide_dtype(row * self.dtype.itemsize)
        self._token_rows = self.buffer.view(-1, row).view(self._wide)
        self._block_rows = self.buffer.view(-1, self.block_size * row).view(self._wide)
        self._scratch: torch.Tensor | None = None
        default_chunk = _COPY_CHUNK_BYTES.get(self.device.type, 4 << 20)
        self.copy_chunk_bytes = positive_int(
            "copy_chunk_bytes", default_chunk if copy_chunk_bytes is None else copy_chunk_bytes
        )

    @classmethod
    def from_plan(cls, shape: KVCacheShape, plan: CachePlan) -> KVCacheStorage:
        """Storage sized by ``plan_cache`` (same shape, device and dtype)."""
        return cls(shape, plan.num_blocks, device=plan.device, dtype=plan.dtype)

    # ---------------------------------------------------------------- views

    def layer(self, index: int) -> torch.Tensor:
        """Layer ``index``'s ``[2, num_blocks, block_size, heads, head_size]`` view."""
        check_count(index, "layer", self.shape.num_layers - 1)
        return self.buffer[index]

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        """Every layer's view, as vLLM's ``kv_caches`` list."""
        return list(self.buffer.unbind(0))

    @property
    def bytes_per_block(self) -> int:
        return self.shape.bytes_per_block(self.dtype)

    def memory_facts(self) -> MemoryFacts:
        s = self.shape
        return MemoryFacts(
            device=str(self.device),
            dtype=dtype_name(self.dtype),
            num_layers=s.num_layers,
            num_kv_heads=s.num_kv_heads,
            head_size=s.head_size,
            block_size=s.block_size,
            num_blocks=self.num_blocks,
            bytes_per_block=self.bytes_per_block,
            bytes_allocated=self.buffer.numel() * self.buffer.element_size(),
        )

    def memory_breakdown(
        self, *, num_in_use: int, num_cached: int, num_empty: int
    ) -> MemoryBreakdown:
        """Bytes holding live / cached / empty blocks, from the pool's counts."""
        return memory_breakdown(
            self.memory_facts(), num_in_use=num_in_use, num_cached=num_cached, num_empty=num_empty
        )

    # -------------------------------------------------------------- indexing

    def slot_mapping(self, block_ids: IndexLike, start: int, end: int) -> torch.Tensor:
        """Slots of tokens ``start .. end-1`` of a request whose block table
        (ordered block ids) is ``block_ids``; ids are checked."""
        table = self._block_table(block_ids)
        end = check_count(end, "end", table.numel() * self.block_size)
        start = check_count(start, "start", end)
        pos = torch.arange(start, end, device=self.device)
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def _block_table(self, block_ids: IndexLike) -> torch.Tensor:
        return checked_index(block_ids, "block ids", self.num_blocks).to(self.device)

    def _planes_for(self, layer: int | None) -> torch.Tensor:
        if layer is None:
            return torch.arange(self._planes, device=self.device)
        check_count(layer, "layer", self.shape.num_layers - 1)
        return torch.arange(2 * layer, 2 * layer + 2, device=self.device)

    def _rows(self, planes: torch.Tensor, index: torch.Tensor, per_plane: int) -> torch.Tensor:
        return (planes[:, None] * per_plane + index[None, :]).reshape(-1)

    def _kv_shape(self, num_tokens: int, layer: int | None) -> tuple[int, ...]:
        s = self.shape
        tail = (2, num_tokens, s.num_kv_heads, s.head_size)
        return tail if layer is not None else (s.num_layers, *tail)

    def _check_tensor(self, tensor: object, shape: tuple[int, ...], what: str) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise StorageError(f"{what} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != self.device:
            raise StorageError(f"{what} is on {tensor.device}, the storage on {self.device}")
        if tensor.dtype != self.dtype:
            raise StorageError(f"{what} has dtype {tensor.dtype}, the storage {self.dtype}")
        if tuple(tensor.shape) != shape:
            raise StorageError(f"{what} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor

    def _as_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as token rows of the wide type (a view when possible)."""
        flat = tensor.reshape(-1, self.shape.num_kv_heads * self.shape.head_size)
        wide_size = self._wide.itemsize
        if not flat.is_contiguous() or flat.data_ptr() % wide_size:
            flat = flat.clone(memory_format=torch.contiguous_format)
        return flat.view(self._wide)

    # -------------------------------------------------------------- operations

    def write(self, slot_mapping: IndexLike, kv: torch.Tensor, *, layer: int | None = None) -> None:
        """Store K/V of a run of tokens at their slots (vLLM's reshape_and_cache).

        ``kv`` is ``[num_layers, 2, T, heads, head_size]`` (every layer) or,
        with ``layer``, ``[2, T, heads, head_size]``; ``slot_mapping`` holds T
        distinct slots in ``[0, num_blocks * block_size)``."""
        slots = as_index(slot_mapping, "slot mapping")
        n = slots.numel()
        kv = self._check_tensor(kv, self._kv_shape(n, layer), "kv")
        planes = self._planes_for(layer)
        slots = checked_index(slots, "slots", self.num_slots, unique=True)
        if n == 0:
            return
        slots = slots.to(self.device)
        rows = self._rows(planes, slots, self.num_slots)
        self._token_rows.index_copy_(0, rows, self._as_rows(kv))

    def gather(
        self,
        block_ids: IndexLike,
        num_tokens: int,
        *,
        layer: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """K/V of a request's first ``num_tokens`` tokens through its block
        table: ``[num_layers, 2, n, heads, head_size]``, or ``[2, n, ...]``
        for one ``layer``.  ``out`` (contiguous, that shape) is filled and
        returned instead of a new tensor."""
        slots = self.slot_mapping(block_ids, 0, num_tokens)
        planes = self._planes_for(layer)
        shape = self._kv_shape(slots.numel(), layer)
        if out is None:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
        else:
            self._check_tensor(out, shape, "out")
            if not out.is_contiguous() or out.data_ptr() % self._wide.itemsize:
                raise StorageError("out must be a contiguous, freshly allocated tensor")
        if slots.numel():
            rows = self._rows(planes, slots, self.num_slots)
            torch.index_select(self._token_rows, 0, rows, out=self._as_rows(out))
        return out

    def copy_blocks(self, src_block_ids: IndexLike, dst_block_ids: IndexLike) -> None:
        """Copy every layer's K/V of block ``src[i]`` into ``dst[i]``, for all
        pairs at once.  Destinations must be distinct and not sources."""
        src = as_index(src_block_ids, "source block ids")
        dst = as_index(dst_block_ids, "destination block ids")
        if src.numel() != dst.numel():
            raise StorageError(f"{src.numel()} source ids but {dst.numel()} destination ids")
        src = checked_index(src, "source block ids", self.num_blocks).to(self.device)
        dst = checked_index(
            dst, "destination block ids", self.num_blocks, unique=True, exclude=src
        ).to(self.device)
        if src.numel() == 0:
            return
        planes = self._planes_for(None)
        src_rows = self._rows(planes, src, self.num_blocks)
        dst_rows = self._rows(planes, dst, self.num_blocks)
        scratch = self._copy_scratch()
        step = scratch.shape[0]
        for i in range(0, src_rows.numel(), step):
            part = scratch[: min(step, src_rows.numel() - i)]
            torch.index_select(self._block_rows, 0, src_rows[i : i + step], out=part)
            self._block_rows.index_copy_(0, dst_rows[i : i + step], part)

    def _copy_scratch(self) -> torch.Tensor:
        if self._scratch is None:
            row_bytes = self._block_rows.shape[1] * self._wide.itemsize
            rows = max(1, self.copy_chunk_bytes // row_bytes)
            rows = min(rows, self._block_rows.shape[0])
            self._scratch = torch.empty(
                (rows, self._block_rows.shape[1]), dtype=self._wide, device=self.device
            )
        return self._scratch

    def zero_blocks(self, block_ids: IndexLike) -> None:
        """Fill every layer's K/V of the given blocks with zeros."""
        ids = checked_index(block_ids, "block ids", self.num_blocks).to(self.device)
        if ids.numel():
            rows = self._rows(self._planes_for(None), ids, self.num_blocks)
            self._block_rows.index_fill_(0, rows, 0)
