"""The dashboard's JS unit tests (node --test), on frames from the real encoder.

frontend/tests/make_fixtures.py writes frames with the server's own code
(Engine + StreamHub) and the Python mirror's expectations into a temporary
folder; ``node --test frontend/tests/`` then checks the browser-side state
model against them (BP_FIXTURES points it there).  Fails -- never skips --
when node is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.cli import run_tool

REPO = Path(__file__).resolve().parents[2]


def test_node_unit_tests(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is missing: the dashboard's JS unit tests need Node.js >= 18")
    fixtures = tmp_path / "frames"
    make = REPO / "frontend" / "tests" / "make_fixtures.py"
    run_tool([sys.executable, str(make), str(fixtures)], timeout=300)
    env = {**os.environ, "BP_FIXTURES": str(fixtures)}
    out = run_tool([node, "--test", "frontend/tests/"], env=env, timeout=300)
    passed = re.search(r"^# pass (\d+)", out, re.M)
    failed = re.search(r"^# fail (\d+)", out, re.M)
    assert passed and failed, out[-3000:]
    assert int(failed.group(1)) == 0
    assert int(passed.group(1)) >= 20, f"only {passed.group(1)} JS tests ran"
