"""A small differential check in the suite: our pool and manager against
vLLM 0.16.0's own, side by side, operation for operation, for a few seeds
(bench/compare_vllm.py; the long runs are in bench/)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.vllm_envs import REPO, vllm016_python


@pytest.mark.vllm016
def test_a_few_seeds_match_vllm016_call_for_call() -> None:
    python = vllm016_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [python, str(REPO / "bench" / "compare_vllm.py"), "--seeds", "2", "--ops", "300"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "DIVERGENCE" not in out
    assert "OK: blockpool matches vLLM 0.16.0 call for call" in out
    runs = [line for line in out.splitlines() if line.lstrip().startswith("ok ")]
    assert len(runs) >= 8, out[-4000:]  # every configuration ran, each seed
