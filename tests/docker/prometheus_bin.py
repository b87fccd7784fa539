"""Debian's ``prometheus`` package for the suite: ``promtool`` (rule checks
and rule unit tests) and the ``prometheus`` server (PromQL parsed by the real
engine).  Missing, they fail the test -- never skip it, as node and Chromium
do: CI installs the package (``apt-get install -y prometheus``) and so does a
developer running these tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.ports import free_port
from tests.support.wait import CLIENT_TIMEOUT, eventually

INSTALL = "install Debian's prometheus package (apt-get install -y prometheus)"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: {INSTALL}")
    return path


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@contextlib.contextmanager
def prometheus_server(jobs: dict[str, str] | None = None) -> Iterator[httpx.Client]:
    """A real Prometheus on 127.0.0.1 (a free port, an empty TSDB) scraping
    ``jobs`` (job name -> host:port) every second: a client on its HTTP API,
    once it is ready and every target is up.  Stopped by its PID afterwards."""
    exe = binary("prometheus")
    jobs = jobs or {}
    with tempfile.TemporaryDirectory(prefix="bp-prom-") as tmp:
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {"job_name": job, "static_configs": [{"targets": [target]}]}
                        for job, target in jobs.items()
                    ],
                }
            )
        )
        port = free_port()
        log = open(Path(tmp) / "prometheus.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                exe, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log, stderr=log,
        )  # fmt: skip
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=CLIENT_TIMEOUT)

        def ready() -> bool:
            if proc.poll() is not None:
                text = (Path(tmp) / "prometheus.log").read_text(errors="replace")
                raise AssertionError(f"prometheus exited {proc.returncode}: {text[-2000:]}")
            try:
                return client.get("/-/ready").status_code == 200
            except httpx.TransportError:
                return False

        def up() -> bool:
            active = client.get("/api/v1/targets").json()["data"]["activeTargets"]
            return len(active) == len(jobs) and all(a["health"] == "up" for a in active)

        try:
            eventually(ready, 120, "prometheus to be ready", poll=0.2)
            eventually(up, 120, f"every target up: {jobs}", poll=0.5)
            yield client
        finally:
            client.close()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
