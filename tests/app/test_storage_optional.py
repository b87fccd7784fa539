"""The service without torch: it starts with K/V storage off and says so,
once in the log and at /api/storage; a K/V memory budget (which only storage
can turn into a block count) is refused with the reason."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.pool import storage_link
from tests.app.conftest import make_app, make_settings, running

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import torch`` fails as it does where torch is not installed."""
    monkeypatch.setitem(sys.modules, "torch", None)


async def test_without_torch_storage_is_off_and_says_why(
    no_torch: None,  # noqa: ARG001 fixture used for its side effect
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="blockpool"):
        app = make_app()  # storage is on by default
    said = [r for r in caplog.records if "torch" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert said[0].levelno == logging.WARNING
    assert "storage is off" in said[0].getMessage()
    assert "blockpool[storage]" in said[0].getMessage()
    assert app.state.settings.storage is False and app.state.engine.storage is None
    async with running(app) as api:
        facts = await api.ok("GET", "/api/storage")
        assert facts == {"enabled": False, "reason": app.state.storage_off}
        assert "torch" in facts["reason"]
        assert (await api.ok("GET", "/api/config"))["storage"] is None
        # the pool works: admit a request, finish it
        req = await api.admit(list(range(12)))
        await api.finish(req["request_id"])
        api.check()
    assert [r for r in caplog.records if "torch" in r.getMessage()] == said  # said once


async def test_storage_off_by_setting_says_so(no_torch: None) -> None:  # noqa: ARG001 fixture used for its side effect
    app = make_app(storage=False)
    assert app.state.storage_off is None  # nothing to warn about: it was asked for
    async with running(app) as api:
        facts = await api.ok("GET", "/api/storage")
        assert facts == {"enabled": False, "reason": storage_link.OFF_BY_SETTING}
        api.check()


async def test_with_torch_storage_is_on() -> None:
    app = make_app()
    assert app.state.storage_off is None and app.state.engine.storage is not None
    async with running(app) as api:
        facts = await api.ok("GET", "/api/storage")
        assert facts["enabled"] is True and facts["num_blocks"] == 64
        assert "reason" not in facts
        api.check()


def test_memory_budget_without_torch_is_refused(no_torch: None) -> None:  # noqa: ARG001 fixture used for its side effect
    settings = make_settings(num_blocks=None, memory_budget_bytes=1 << 20)
    with pytest.raises(ValueError, match=r"needs torch.*blockpool\[storage\]"):
        storage_link.settle(settings)


def test_the_service_imports_and_serves_without_torch() -> None:
    """In a fresh interpreter where torch cannot be imported: the app module
    graph loads and /api/storage answers (nothing imports torch at import)."""
    script = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None
        from fastapi.testclient import TestClient
        from app.main import create_app
        from app.shared.settings import Settings
        app = create_app(Settings(num_blocks=32, block_size=4))
        with TestClient(app, base_url="http://127.0.0.1:8000") as client:
            body = client.get("/api/storage").json()
            assert body["enabled"] is False and "torch" in body["reason"], body
            assert client.get("/").status_code == 200
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert out.stderr.count("storage is off") == 1, out.stderr
