"""A small differential check in the suite: our pool and manager against
vLLM 0.16.0's own, side by side, operation for operation, for a few seeds
(bench/compare_vllm.py; the long runs are in bench/)."""

from __future__ import annotations

import os

import pytest

from tests.support.cli import run_tool
from tests.vllm_envs import REPO, vllm016_python


def _compare(script: str, seeds: int, ops: int) -> str:
    """The output of a bench/ differential script run in vLLM 0.16.0's env."""
    python = vllm016_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    cmd = [python, str(REPO / "bench" / script), "--seeds", str(seeds), "--ops", str(ops)]
    return run_tool(cmd, env=env, timeout=900)


@pytest.mark.vllm016
def test_a_few_seeds_match_vllm016_call_for_call() -> None:
    out = _compare("compare_vllm.py", 2, 300)
    assert "DIVERGENCE" not in out
    assert "OK: blockpool matches vLLM 0.16.0 call for call" in out
    runs = [line for line in out.splitlines() if line.lstrip().startswith("ok ")]
    assert len(runs) >= 8, out[-4000:]  # every configuration ran, each seed


@pytest.mark.vllm016
def test_hybrid_kv_cache_groups_match_vllm016_call_for_call() -> None:
    """KVCacheCoordinator against vLLM's KVCacheManager over every hybrid
    configuration (bench/compare_vllm_hybrid.py)."""
    out = _compare("compare_vllm_hybrid.py", 2, 500)
    assert "DIVERGENCE" not in out
    assert "OK: KVCacheCoordinator matches vLLM 0.16.0's KVCacheManager" in out
    runs = [line for line in out.splitlines() if line.lstrip().startswith("ok ")]
    assert len(runs) >= 36, out[-4000:]  # 18 configurations, 2 seeds each
    exercised = out.rsplit("operations exercised:", 1)[-1]
    for op in ("refused", "preempted", "prefill a chunk", "re-admit", "remove_skipped_blocks"):
        assert f"{op} " in exercised, op
