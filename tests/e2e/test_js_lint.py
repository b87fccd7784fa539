"""The dashboard's JS gates, run with npx (no install in the tree, no build
step): eslint with frontend/eslint.config.mjs over js/ and the unit tests,
and TypeScript's checker (frontend/jsconfig.json: checkJs) over every module,
each marked ``// @ts-check``, uPlot typed by its own vendored uPlot.d.ts.
npm keeps what it fetched in .cache/npm under the repository (git ignores
it), so a second run needs no network.  Fails -- never skips -- when npx is
missing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.cli import run_tool

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
ESLINT = "eslint@9.39.1"
TYPESCRIPT = "typescript@5.9.3"


def _npx(*args: str) -> str:
    """``npx PACKAGE ...`` in frontend/: its output; fails when it finds anything."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.fail("npx is missing: the JS lint needs Node.js >= 18 with npm")
    env = {**os.environ, "npm_config_cache": str(REPO / ".cache" / "npm")}
    return run_tool([npx, "--yes", "--prefer-offline", *args], cwd=FRONTEND, env=env, timeout=600)


def test_eslint_finds_nothing() -> None:
    _npx(ESLINT, "--config", "eslint.config.mjs", "--max-warnings", "0", ".")


def _modules() -> list[Path]:
    return sorted((FRONTEND / "js").rglob("*.js"))


def test_every_module_is_type_checked_without_escapes() -> None:
    """Every module opens with ``// @ts-check`` (jsconfig.json checks them all
    anyway: checkJs), and none turns the checker off for a line or a file."""
    assert len(_modules()) >= 50
    unmarked = [
        str(p.relative_to(FRONTEND))
        for p in _modules()
        if not p.read_text().startswith("// @ts-check\n")
    ]
    assert unmarked == []
    escapes = ("@ts-ignore", "@ts-nocheck", "@ts-expect-error", "{any}", "{*}")
    found = [
        f"{p.relative_to(FRONTEND)}:{n}"
        for p in _modules()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if any(e in line for e in escapes)
    ]
    assert found == []
    config = (FRONTEND / "jsconfig.json").read_text()
    assert '"checkJs": true' in config
    assert '"strictNullChecks": true' in config


def test_the_modules_type_check() -> None:
    _npx("-p", TYPESCRIPT, "tsc", "-p", "jsconfig.json")
