"""The dashboard's JS gates, run with npx (no install in the tree, no build
step): eslint with frontend/eslint.config.mjs over js/ and the unit tests,
and TypeScript's checker over the files marked ``// @ts-check``
(frontend/jsconfig.json).  npm keeps what it fetched in .cache/npm under the
repository (git ignores it), so a second run needs no network.  Fails --
never skips -- when npx is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
ESLINT = "eslint@9.39.1"
TYPESCRIPT = "typescript@5.9.3"


def _npx(*args: str) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    if npx is None:
        pytest.fail("npx is missing: the JS lint needs Node.js >= 18 with npm")
    env = {**os.environ, "npm_config_cache": str(REPO / ".cache" / "npm")}
    return subprocess.run(
        [npx, "--yes", "--prefer-offline", *args],
        cwd=FRONTEND,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_eslint_finds_nothing() -> None:
    proc = _npx(ESLINT, "--config", "eslint.config.mjs", "--max-warnings", "0", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_checked_files_type_check() -> None:
    checked = [p for p in (FRONTEND / "js").rglob("*.js") if "// @ts-check" in p.read_text()]
    assert len(checked) >= 30  # the marked files (more as the rest are fixed)
    proc = _npx("-p", TYPESCRIPT, "tsc", "-p", "jsconfig.json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
