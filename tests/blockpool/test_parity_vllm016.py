"""A small differential check in the suite: our pool and manager against
vLLM 0.16.0's own, side by side, operation for operation, for a few seeds
(bench/compare_vllm.py; the long runs are in bench/)."""

from __future__ import annotations

import os

import pytest

from tests.support.cli import run_tool
from tests.vllm_envs import REPO, vllm016_python


@pytest.mark.vllm016
def test_a_few_seeds_match_vllm016_call_for_call() -> None:
    python = vllm016_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    cmd = [python, str(REPO / "bench" / "compare_vllm.py"), "--seeds", "2", "--ops", "300"]
    out = run_tool(cmd, env=env, timeout=900)
    assert "DIVERGENCE" not in out
    assert "OK: blockpool matches vLLM 0.16.0 call for call" in out
    runs = [line for line in out.splitlines() if line.lstrip().startswith("ok ")]
    assert len(runs) >= 8, out[-4000:]  # every configuration ran, each seed
