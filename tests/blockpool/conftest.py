"""The device and dtype the storage tests run on (test_storage*.py).

The library default (CUDA when available, else CPU) unless
BLOCKPOOL_STORAGE_DEVICE forces one (scripts/gpu_check.sh sets it to cuda);
BLOCKPOOL_STORAGE_DTYPE likewise overrides the dtype.  torch is imported
only by the tests that ask for them: the pool's own tests run without it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch


@pytest.fixture
def device() -> torch.device:
    from blockpool.storage import resolve_device

    return resolve_device(os.environ.get("BLOCKPOOL_STORAGE_DEVICE") or None)


@pytest.fixture
def dtype(device: torch.device) -> torch.dtype:
    from blockpool.storage import resolve_dtype

    return resolve_dtype(os.environ.get("BLOCKPOOL_STORAGE_DTYPE") or None, device)
