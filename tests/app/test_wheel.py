"""What a user installs works (bar ``10-wheel-serves``).

Build the wheel from a copy of the source tree, install it with the
``service`` extra into a fresh venv that has no torch, start ``blockpool
serve`` from a folder outside the repository, then: ``/`` and the fleet page
load every script and style (followed through ES module imports), ``/docs``
references only this server's assets and they are served, and K/V storage is
off — said once in the log and at ``/api/storage``.

Slow (a minute or two) and it needs the package index that pip is configured
with (PyPI, or a local mirror / wheelhouse) for the service's dependencies.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from tests.app.conftest import free_port
from tests.app.page_assets import client_get, crawl

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml", "README.md", "LICENSE", "app", "blockpool", "frontend", "blockpool_vllm",
)  # fmt: skip


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    assert out.returncode == 0, f"{cmd}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out  # type: ignore[no-any-return]


def build_wheel(tmp: Path) -> Path:
    """The wheel, built (offline, with this interpreter's setuptools) from a
    copy of the tree, so nothing is written into the checkout."""
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        elif path.is_file():
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "-q", "-w", str(dist), str(src)])  # fmt: skip
    (wheel,) = dist.glob("blockpool-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and its service extra (and no torch)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          f"{wheel}[service]"], cwd=tmp)  # fmt: skip
    return env_dir


def _clean_env(env_dir: Path) -> dict[str, str]:
    keep = {"HOME", "LANG", "LC_ALL", "TMPDIR", "PIP_INDEX_URL", "PIP_FIND_LINKS"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = f"{env_dir / 'bin'}:/usr/bin:/bin"
    return env


def test_the_venv_has_no_torch_and_the_frontend_is_package_data(installed: Path) -> None:
    python = str(installed / "bin" / "python")
    env = _clean_env(installed)
    outside = installed.parent
    no_torch = subprocess.run([python, "-c", "import torch"], capture_output=True,
                              cwd=outside, env=env, check=False)  # fmt: skip
    assert no_torch.returncode != 0
    where = _run(
        [python, "-c",
         "import app.main, importlib.util; print(app.main.FRONTEND); "
         "print(importlib.util.find_spec('frontend').submodule_search_locations[0])"],
        cwd=outside, env=env,
    ).stdout.split()  # fmt: skip
    site = next((installed / "lib").glob("python3*/site-packages"))
    assert where == [str(site / "frontend")] * 2
    assert not (site / "frontend" / "tests").exists()  # the JS tests stay out
    # the engine side of `serve --mirror` ships in the same wheel (extra `vllm`)
    assert (site / "blockpool_vllm" / "scheduler.py").exists()


@pytest.fixture(scope="module")
def served(installed: Path) -> Iterator[tuple[str, Path]]:
    """``blockpool serve`` of the installed wheel, run outside the repository."""
    outside = installed.parent / "outside"
    outside.mkdir()
    port = free_port()
    log = outside / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(installed / "bin" / "blockpool"), "serve", "--port", str(port)],
            cwd=outside, env=_clean_env(installed), stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a startup bound, not a measurement
        while True:
            assert proc.poll() is None, f"blockpool serve exited:\n{log.read_text()}"
            try:
                if httpx.get(f"{base}/api/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"no answer from {base}:\n{log.read_text()}"
            time.sleep(0.2)
        yield base, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_dashboard_and_fleet_page_load_every_script_and_style(
    served: tuple[str, Path],
) -> None:
    base, _ = served
    with httpx.Client(timeout=30) as client:
        result = crawl(client_get(client), base, ["/", "/static/fleet.html"])
    assert result.problems() == []
    kinds = [kind for kind, _, _ in result.fetched.values()]
    assert kinds.count("html") == 2
    assert kinds.count("style") >= 4 and kinds.count("script") >= 1
    assert kinds.count("module") >= 20  # the dashboard's and the fleet page's modules
    # each page's entry module (whatever the frontend's layout) was among them
    with httpx.Client(timeout=30) as client:
        for page in ("/", "/static/fleet.html"):
            html = client.get(f"{base}{page}").text
            entries = re.findall(r'<script type="module" src="([^"]+)"', html)
            assert entries, page
            assert all(urljoin(f"{base}{page}", e) in result.fetched for e in entries), entries


def test_docs_load_nothing_from_outside_the_server(served: tuple[str, Path]) -> None:
    base, _ = served
    with httpx.Client(timeout=30) as client:
        html = client.get(f"{base}/docs").text
        assert "://" not in html, html  # no absolute URL at all: only this server
        result = crawl(client_get(client), base, ["/docs"])
        spec = client.get(f"{base}/openapi.json")
    assert result.problems() == []
    assert {kind for kind, _, _ in result.fetched.values()} == {"html", "script", "style", "png"}
    assert spec.status_code == 200 and "/api/pool/allocate" in spec.json()["paths"]


def test_storage_is_off_and_said_once(served: tuple[str, Path]) -> None:
    base, log = served
    body = httpx.get(f"{base}/api/storage", timeout=30).json()
    assert body["enabled"] is False and "torch" in body["reason"], body
    text = log.read_text()
    assert text.count("storage is off") == 1, text
    assert "Traceback" not in text, text


def test_without_the_service_extra_the_command_names_it(tmp_path: Path) -> None:
    """A plain ``pip install blockpool`` has the library; ``blockpool serve``
    then says which extra to install (exit 2), not a traceback, and the
    library itself works."""
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "bare"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
         cwd=tmp_path)  # fmt: skip
    env = _clean_env(env_dir)
    out = subprocess.run([str(env_dir / "bin" / "blockpool"), "serve"], capture_output=True,
                         text=True, cwd=tmp_path, env=env, check=False)  # fmt: skip
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "pip install 'blockpool[service]'" in out.stderr
    assert "Traceback" not in out.stderr
    lib = _run(
        [python, "-c",
         "from blockpool import BlockPool, check_invariants; p = BlockPool(8, True, 16, False); "
         "b = p.get_new_blocks(3); p.free_blocks(b); check_invariants(p); "
         "print([x.block_id for x in p.get_new_blocks(2)])"],
        cwd=tmp_path, env=env,
    )  # fmt: skip
    assert lib.stdout.split() == ["[4,", "5]"]  # freed blocks join the tail: 4 and 5 come first
