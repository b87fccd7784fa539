"""Joins the torch-backed K/V storage to the engine (vLLM's scheduler/worker
split: the pool deals in block ids, storage in tensors indexed by block id).

When an operation computes tokens (admit: the tokens after the prefix hit;
append: the new tokens) the engine asks this link to write their K/V — made
by the deterministic stand-in model — into the request's blocks.  Reused
prefix blocks are not written: a request that hits the cache reads what the
earlier request left there, and ``verify`` checks bit for bit that it is the
K/V the model computes for this request's tokens.

torch is optional (the ``storage`` extra): without it the service runs with
storage off, and ``settle`` says why, once, for the log and ``/api/storage``.
"""

from __future__ import annotations

from typing import Any

from app.shared.settings import Settings
from blockpool import ManagedRequest


class EngineStorage:
    def __init__(self, settings: Settings) -> None:
        import torch

        # The service's K/V writes run on its event loop, a few thousand values
        # at a time: torch's intra-op threads buy nothing there and, on a busy
        # machine, OpenMP's contention made one 65k-value write ~30x slower
        # (114 ms vs 3.9 ms measured on 2 loaded cores).  One thread.
        torch.set_num_threads(1)
        from blockpool.storage import (
            KVCacheShape,
            KVCacheStorage,
            StandInModel,
            plan_cache,
        )

        self.shape = KVCacheShape(
            num_layers=settings.num_layers,
            num_kv_heads=settings.num_kv_heads,
            head_size=settings.head_size,
            block_size=settings.block_size,
        )
        if settings.memory_budget_bytes is not None:
            plan = plan_cache(
                self.shape,
                device=settings.storage_device,
                budget_bytes=settings.memory_budget_bytes,
            )
        else:
            plan = plan_cache(
                self.shape,
                device=settings.storage_device,
                num_blocks=settings.effective_num_blocks,
            )
        self.plan = plan
        self.storage = KVCacheStorage.from_plan(self.shape, plan)
        self.model = StandInModel(self.shape, seed=0)
        self.num_blocks = plan.num_blocks
        self.tokens_written = 0
        self.writes = 0
        self.verifications = 0
        self.verify_failures = 0

    def write_request(self, managed: ManagedRequest, start_token: int) -> None:
        from blockpool.storage import write_request_tokens

        tokens = managed.request.all_token_ids
        for table in managed.block_tables:
            ids = [b.block_id for b in table]
            self.tokens_written += write_request_tokens(
                self.storage, self.model, ids, tokens, start_token
            )
        self.writes += 1

    def verify(self, managed: ManagedRequest) -> dict[str, Any]:
        """Do the request's blocks hold the model's K/V for its tokens?"""
        from blockpool.storage import verify_request

        tokens = managed.request.all_token_ids
        groups = []
        for table in managed.block_tables:
            result = verify_request(self.storage, self.model, [b.block_id for b in table], tokens)
            groups.append(result.as_dict())
        ok = all(g["ok"] for g in groups)
        self.verifications += 1
        self.verify_failures += not ok
        return {"ok": ok, "groups": groups}

    def facts(self, num_in_use: int, num_cached: int, num_empty: int) -> dict[str, Any]:
        out: dict[str, Any] = self.storage.memory_facts().as_dict()
        out["bytes"] = self.storage.memory_breakdown(
            num_in_use=num_in_use, num_cached=num_cached, num_empty=num_empty
        ).as_dict()
        out["sized_by"] = self.plan.sized_by
        out["tokens_written"] = self.tokens_written
        out["verifications"] = self.verifications
        out["verify_failures"] = self.verify_failures
        return out

    def metrics(self) -> dict[str, float]:
        return {
            "tokens_written_total": float(self.tokens_written),
            "verifications_total": float(self.verifications),
            "verify_failures_total": float(self.verify_failures),
        }


def make_storage(settings: Settings) -> EngineStorage:
    return EngineStorage(settings)


OFF_BY_SETTING = "K/V storage is off by setting (--no-storage / BLOCKPOOL_STORAGE=false)"
INSTALL_HINT = "install the 'storage' extra to turn it on: pip install 'blockpool[storage]'"


def torch_missing() -> str | None:
    """Why torch cannot be used here, or None when it imports."""
    try:
        import torch  # noqa: F401
    except (ImportError, OSError) as exc:  # absent, or a broken install
        return f"torch is not available ({type(exc).__name__}: {exc})"
    return None


def settle(settings: Settings) -> tuple[Settings, str | None]:
    """The settings the server can run with, and why storage is off when it
    was asked for but cannot be had (None: nothing to say).

    Storage is on by default; without torch the server still starts, with
    storage off — unless the pool's size was asked for as a K/V memory
    budget, which only storage can turn into a block count (ValueError)."""
    if not settings.storage:
        return settings, None
    missing = torch_missing()
    if missing is None:
        return settings, None
    if settings.memory_budget_bytes is not None:
        raise ValueError(
            f"--memory-budget needs K/V storage, and storage needs torch: {missing}; "
            f"{INSTALL_HINT}, or give --num-blocks"
        )
    reason = f"K/V storage is off: {missing}; {INSTALL_HINT}"
    return settings.model_copy(update={"storage": False}), reason
