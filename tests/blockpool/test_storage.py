"""KVCacheStorage: sizing, layout, and write / gather / copy / zero by block id.

The device and dtype: the ``device`` / ``dtype`` fixtures (conftest.py):
the library default unless BLOCKPOOL_STORAGE_DEVICE / BLOCKPOOL_STORAGE_DTYPE
force one (scripts/gpu_check.sh sets the device to cuda).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from blockpool.storage import (
    KVCacheShape,
    KVCacheStorage,
    MemoryFacts,
    StorageError,
    memory_breakdown,
    plan_cache,
    resolve_device,
    resolve_dtype,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHAPE = KVCacheShape(num_layers=3, num_kv_heads=2, head_size=8, block_size=4)
NUM_BLOCKS = 12


@pytest.fixture
def storage(device: torch.device, dtype: torch.dtype) -> KVCacheStorage:
    st = KVCacheStorage(SHAPE, NUM_BLOCKS, device=device, dtype=dtype)
    gen = torch.Generator(device="cpu").manual_seed(1)
    st.buffer.copy_(torch.randn(st.buffer.shape, generator=gen).to(st.buffer))
    return st


def _random_kv(
    st: KVCacheStorage, n: int, *, layer: int | None = None, seed: int = 2
) -> torch.Tensor:
    shape: tuple[int, ...] = (2, n, SHAPE.num_kv_heads, SHAPE.head_size)
    if layer is None:
        shape = (SHAPE.num_layers, *shape)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device=st.device, dtype=st.dtype)


def _by_slot(st: KVCacheStorage) -> torch.Tensor:
    """Reference view [layers, 2, slots, heads, head_size] of the buffer."""
    s = SHAPE
    return st.buffer.view(s.num_layers, 2, st.num_slots, s.num_kv_heads, s.head_size)


# ------------------------------------------------------------------ isolation


def test_import_blockpool_does_not_import_torch() -> None:
    code = "import blockpool, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_only_the_storage_package_imports_torch() -> None:
    outside = [
        p.relative_to(ROOT)
        for p in (ROOT / "blockpool").rglob("*.py")
        if "storage" not in p.relative_to(ROOT / "blockpool").parts
        and any(
            line.strip().startswith(("import torch", "from torch"))
            for line in p.read_text().splitlines()
        )
    ]
    assert outside == []


# --------------------------------------------------------------- configuration


def test_shape_rejects_non_positive_and_bool() -> None:
    for bad in (0, -1, True, 2.0):
        with pytest.raises(StorageError, match="num_kv_heads must be a positive int"):
            KVCacheShape(num_layers=1, num_kv_heads=bad, head_size=8, block_size=4)  # type: ignore[arg-type]


def test_bytes_per_block_formula() -> None:
    shape = KVCacheShape(num_layers=32, num_kv_heads=8, head_size=128, block_size=16)
    assert shape.bytes_per_block(torch.float16) == 2 * 16 * 8 * 128 * 2 * 32 == 2 << 20
    assert shape.bytes_per_block(torch.float32) == 4 << 20


def test_resolve_device_defaults_to_cuda_when_available_else_cpu() -> None:
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_forcing_cuda_is_clear_either_way() -> None:
    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda"
        with pytest.raises(StorageError, match="only"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")
    else:
        with pytest.raises(StorageError, match="CUDA is not available"):
            resolve_device("cuda")
        with pytest.raises(StorageError, match="CUDA is not available"):
            KVCacheStorage(SHAPE, 4, device="cuda:0")


@pytest.mark.parametrize("bad", ["meta", "not-a-device", "xla"])
def test_resolve_device_rejects_other_devices(bad: str) -> None:
    with pytest.raises(StorageError):
        resolve_device(bad)


def test_resolve_dtype() -> None:
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda", 0)) == torch.float16
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("torch.float16", torch.device("cpu")) == torch.float16
    assert resolve_dtype(torch.float32, torch.device("cpu")) == torch.float32
    with pytest.raises(StorageError, match="unknown dtype"):
        resolve_dtype("int8", torch.device("cpu"))
    with pytest.raises(StorageError, match="unsupported dtype"):
        resolve_dtype(torch.float64, torch.device("cpu"))


def test_plan_by_count_budget_and_fraction() -> None:
    per = SHAPE.bytes_per_block(torch.float32)
    plan = plan_cache(SHAPE, device="cpu", num_blocks=7)
    assert (plan.num_blocks, plan.bytes_per_block, plan.total_bytes) == (7, per, 7 * per)
    assert plan.as_dict()["sized_by"] == "num_blocks"
    plan = plan_cache(SHAPE, device="cpu", budget_bytes=10 * per + per - 1)
    assert (plan.num_blocks, plan.total_bytes, plan.budget_bytes) == (10, 10 * per, 11 * per - 1)
    plan = plan_cache(SHAPE, device="cpu", dtype="float16", memory_fraction=0.5, free_bytes=8 * per)
    assert plan.num_blocks == 8  # half of 8 float32 blocks' bytes = 8 float16 blocks
    assert (plan.dtype, plan.sized_by) == ("float16", "memory_fraction")


def test_plan_from_real_free_memory() -> None:
    plan = plan_cache(SHAPE, device="cpu", memory_fraction=1e-4)
    assert plan.num_blocks >= 1
    assert plan.total_bytes == plan.num_blocks * plan.bytes_per_block <= plan.budget_bytes


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"num_blocks": 4, "budget_bytes": 1 << 20}, "exactly one"),
        ({"num_blocks": 0}, "num_blocks must be a positive int"),
        ({"budget_bytes": 100}, "holds no block"),
        ({"budget_bytes": -5}, "budget_bytes must be a positive int"),
        ({"memory_fraction": 0.0}, "in \\(0, 1\\]"),
        ({"memory_fraction": 1.5}, "in \\(0, 1\\]"),
        ({"memory_fraction": True}, "must be a number"),
        ({"memory_fraction": 0.5, "free_bytes": -1}, "free_bytes"),
        ({"memory_fraction": 0.5, "free_bytes": 10}, "holds no block"),
    ],
)
def test_plan_rejects_bad_configs(kwargs: dict[str, object], message: str) -> None:
    assert issubclass(StorageError, ValueError)
    with pytest.raises(StorageError, match=message):
        plan_cache(SHAPE, device="cpu", **kwargs)  # type: ignore[arg-type]


def test_storage_rejects_bad_block_count() -> None:
    with pytest.raises(StorageError, match="num_blocks"):
        KVCacheStorage(SHAPE, 0, device="cpu")


# ---------------------------------------------------------------- layout


def test_layout_views_and_memory_facts(device: torch.device, dtype: torch.dtype) -> None:
    st = KVCacheStorage.from_plan(
        SHAPE, plan_cache(SHAPE, device=device, dtype=dtype, num_blocks=5)
    )
    assert st.buffer.shape == (3, 2, 5, 4, 2, 8) and st.buffer.dtype == dtype
    assert not st.buffer.any()
    assert [tuple(t.shape) for t in st.kv_caches] == [(2, 5, 4, 2, 8)] * 3
    layer1 = st.layer(1)
    assert layer1.is_contiguous() and layer1.data_ptr() == st.kv_caches[1].data_ptr()
    st.write([2 * 4 + 3], torch.ones((2, 1, 2, 8), dtype=dtype, device=device), layer=1)
    assert bool((layer1[:, 2, 3] == 1).all()) and int(layer1.count_nonzero()) == 2 * 2 * 8
    facts = st.memory_facts()
    per = SHAPE.bytes_per_block(dtype)
    assert facts == MemoryFacts(str(device), str(dtype)[6:], 3, 2, 8, 4, 5, per, 5 * per)
    assert facts.bytes_allocated == st.buffer.numel() * st.buffer.element_size()
    with pytest.raises(StorageError, match="layer"):
        st.layer(3)


def test_memory_breakdown() -> None:
    facts = KVCacheStorage(SHAPE, 10, device="cpu").memory_facts()
    per = facts.bytes_per_block
    got = memory_breakdown(facts, num_in_use=3, num_cached=4, num_empty=2)
    assert got.as_dict() == {
        "live_bytes": 3 * per,
        "cached_bytes": 4 * per,
        "empty_bytes": 2 * per,
        "other_bytes": per,
        "total_bytes": 10 * per,
    }
    with pytest.raises(StorageError, match="non-negative"):
        memory_breakdown(facts, num_in_use=-1, num_cached=0, num_empty=0)
    with pytest.raises(StorageError, match="11 blocks counted"):
        memory_breakdown(facts, num_in_use=5, num_cached=5, num_empty=1)


def test_slot_mapping(storage: KVCacheStorage) -> None:
    slots = storage.slot_mapping([7, 2, 9], 2, 11)
    assert slots.tolist() == [30, 31, 8, 9, 10, 11, 36, 37, 38]
    assert storage.slot_mapping([7], 1, 1).tolist() == []
    with pytest.raises(StorageError, match="end must be at most 12"):
        storage.slot_mapping([7, 2, 9], 0, 13)


# ---------------------------------------------------------------- operations


def test_write_every_layer(storage: KVCacheStorage) -> None:
    before = _by_slot(storage).clone()
    slots = [5, 6, 7, 40, 0, 47]
    kv = _random_kv(storage, len(slots))
    storage.write(torch.tensor(slots, dtype=torch.int32), kv)
    after = _by_slot(storage)
    assert torch.equal(after[:, :, slots], kv)
    others = [s for s in range(storage.num_slots) if s not in slots]
    assert torch.equal(after[:, :, others], before[:, :, others])


def test_write_one_layer(storage: KVCacheStorage) -> None:
    before = _by_slot(storage).clone()
    kv = _random_kv(storage, 3, layer=2)
    storage.write([9, 1, 22], kv, layer=2)
    after = _by_slot(storage)
    assert torch.equal(after[2][:, [9, 1, 22]], kv)
    before[2][:, [9, 1, 22]] = kv
    assert torch.equal(after, before)


def test_write_nothing(storage: KVCacheStorage) -> None:
    before = storage.buffer.clone()
    storage.write([], _random_kv(storage, 0))
    assert torch.equal(storage.buffer, before)


def test_write_accepts_non_contiguous_and_offset_sources(storage: KVCacheStorage) -> None:
    wide = _random_kv(storage, 7)
    kv = wide[:, :, 1:6]  # a view at an odd offset
    storage.write([3, 4, 5, 6, 7], kv)
    assert torch.equal(_by_slot(storage)[:, :, 3:8], kv)
    swapped = _random_kv(storage, 4).transpose(3, 4).contiguous().transpose(3, 4)
    storage.write([10, 11, 12, 13], swapped)
    assert torch.equal(_by_slot(storage)[:, :, 10:14], swapped)
    flat = _random_kv(storage, 3).flatten()
    shifted = flat[1 : 1 + flat.numel() // 3 * 2].view(3, 2, 2, 2, 8)  # contiguous, misaligned
    assert shifted.is_contiguous() and shifted.data_ptr() % 16
    storage.write([20, 21], shifted)
    assert torch.equal(_by_slot(storage)[:, :, 20:22], shifted)


def test_gather_through_block_table(storage: KVCacheStorage) -> None:
    table = [9, 3, 11, 0]
    got = storage.gather(table, 10)  # 2 full blocks + 2 tokens; block 0 unused
    slots = [36, 37, 38, 39, 12, 13, 14, 15, 44, 45]
    assert torch.equal(got, _by_slot(storage)[:, :, slots])
    one = storage.gather(table, 10, layer=1)
    assert torch.equal(one, got[1])
    out = torch.empty_like(got)
    assert storage.gather(table, 10, out=out) is out and torch.equal(out, got)
    assert storage.gather(table, 0).shape == (3, 2, 0, 2, 8)


def test_copy_blocks(storage: KVCacheStorage) -> None:
    before = storage.buffer.clone()
    storage.copy_blocks([1, 5, 5], [7, 2, 11])
    after = storage.buffer
    expected = before.clone()
    expected[:, :, [7, 2, 11]] = before[:, :, [1, 5, 5]]
    assert torch.equal(after, expected)
    storage.copy_blocks([], [])
    assert torch.equal(after, expected)


def test_copy_many_blocks_in_chunks(device: torch.device, dtype: torch.dtype) -> None:
    row_bytes = SHAPE.block_size * SHAPE.num_kv_heads * SHAPE.head_size * dtype.itemsize
    st = KVCacheStorage(SHAPE, 64, device=device, dtype=dtype, copy_chunk_bytes=5 * row_bytes)
    st.buffer.copy_(torch.randn(st.buffer.shape).to(st.buffer))
    before = st.buffer.clone()
    src = list(range(0, 60, 2))
    dst = list(range(63, 3, -2))  # 30 odd ids, 6 layers x 2 x 30 rows in chunks of 5
    st.copy_blocks(src, dst)
    expected = before.clone()
    expected[:, :, dst] = before[:, :, src]
    assert torch.equal(st.buffer, expected)


def test_zero_blocks(storage: KVCacheStorage) -> None:
    before = storage.buffer.clone()
    storage.zero_blocks([4, 0, 4, 11])
    expected = before.clone()
    expected[:, :, [0, 4, 11]] = 0
    assert torch.equal(storage.buffer, expected)


def test_operations_copy_bits_exactly(storage: KVCacheStorage) -> None:
    """Every bit pattern (NaNs, infinities, negative zero) survives write,
    gather and copy: elements are moved, never converted."""
    bits = {2: torch.int16, 4: torch.int32}[storage.dtype.itemsize]
    info = torch.iinfo(bits)
    gen = torch.Generator(device="cpu").manual_seed(3)
    raw = torch.randint(info.min, info.max, (3, 2, 8, 2, 8), generator=gen, dtype=bits)
    kv = raw.to(storage.device).view(storage.dtype)
    assert bool(torch.isnan(kv).any())
    storage.write(storage.slot_mapping([6, 2], 0, 8), kv)
    assert torch.equal(storage.gather([6, 2], 8).view(bits), kv.view(bits))
    storage.copy_blocks([6, 2], [3, 9])
    assert torch.equal(storage.gather([3, 9], 8).view(bits), kv.view(bits))


# ----------------------------------------------------- errors change nothing


def _bad_calls(st: KVCacheStorage) -> dict[str, tuple[Callable[[], object], str]]:
    kv3 = _random_kv(st, 3)
    cpu_kv = kv3.to("cpu")
    other_dtype = torch.float64 if st.dtype != torch.float64 else torch.float32
    return {
        "slot out of range": (lambda: st.write([1, 2, st.num_slots], kv3), "must lie in"),
        "negative slot": (lambda: st.write([1, -1, 2], kv3), "must lie in"),
        "repeated slot": (lambda: st.write([4, 5, 4], kv3), "repeat 1"),
        "too few slots": (lambda: st.write([1, 2], kv3), "shape"),
        "float slots": (lambda: st.write(torch.tensor([1.0, 2.0, 3.0]), kv3), "integers"),
        "2-D slots": (lambda: st.write(torch.tensor([[1, 2, 3]]), kv3), "1-D"),
        "wrong dtype": (lambda: st.write([1, 2, 3], kv3.to(other_dtype)), "dtype"),
        "wrong device": (lambda: st.write([1, 2, 3], kv3.to("meta")), "is on"),
        "wrong shape": (lambda: st.write([1, 2, 3], kv3[:2]), "shape"),
        "layer kv for all": (lambda: st.write([1, 2, 3], kv3[0], layer=5), "layer"),
        "not a tensor": (lambda: st.write([1], cpu_kv.tolist()), "torch.Tensor"),  # type: ignore[arg-type]
        "gather bad id": (lambda: st.gather([1, 12], 5), "must lie in"),
        "gather too many": (lambda: st.gather([1, 2], 9), "at most 8"),
        "gather negative": (lambda: st.gather([1, 2], -1), "non-negative"),
        "gather bad out": (lambda: st.gather([1], 2, out=kv3), "shape"),
        "copy lengths": (lambda: st.copy_blocks([1, 2], [3]), "2 source ids but 1"),
        "copy dst repeated": (lambda: st.copy_blocks([1, 2], [3, 3]), "repeat 1"),
        "copy overlap": (lambda: st.copy_blocks([1, 2], [2, 3]), "also appear among the sources"),
        "copy out of range": (lambda: st.copy_blocks([1, 12], [3, 4]), "must lie in"),
        "copy negative": (lambda: st.copy_blocks([1, 2], [3, -4]), "must lie in"),
        "zero out of range": (lambda: st.zero_blocks([0, 99]), "must lie in"),
        "zero negative": (lambda: st.zero_blocks([-1]), "must lie in"),
        "zero floats": (lambda: st.zero_blocks([1.5]), "integers"),  # type: ignore[list-item]
    }


@pytest.mark.parametrize(
    "case", sorted(_bad_calls(KVCacheStorage(SHAPE, NUM_BLOCKS, device="cpu")))
)
def test_errors_are_clear_and_leave_tensors_unchanged(storage: KVCacheStorage, case: str) -> None:
    call, message = _bad_calls(storage)[case]
    before = storage.buffer.clone()
    with pytest.raises(StorageError, match=message):
        call()
    assert torch.equal(storage.buffer, before)
