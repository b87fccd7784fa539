"""A bench/gpu_scale module run in a vLLM environment, as the tests run it: the
repository on the path, no BLOCKPOOL_ or VLLM_ variable of the caller's, its
JSON report read back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_bench_module(python: str, tmp_path: Path, module: str, *args: str) -> dict[str, Any]:
    out = tmp_path / f"{module.rsplit('.', 1)[-1]}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLOCKPOOL_", "VLLM_"))}
    env.update(PYTHONPATH=str(REPO), PYTHONHASHSEED="0", HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run(
        [python, "-m", module, *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=500,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc
