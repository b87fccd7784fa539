"""A real Prometheus for a test, and the queries of vLLM's own Grafana dashboards.

* ``Prometheus``: Debian's ``prometheus`` binary on 127.0.0.1, a temporary
  config and TSDB, a free port; ``query`` an instant query at a given time.
* ``dashboard_queries``: every PromQL ``expr`` of the dashboards vLLM 0.16.0
  ships with its examples (examples/online_serving/prometheus_grafana/grafana.json
  and examples/online_serving/dashboards/grafana/*.json), read from vLLM's
  source distribution, downloaded once with pip into a cache directory
  (``BLOCKPOOL_VLLM_SDIST_DIR``; nothing of it is copied into the repository).

Without the binary or the source distribution the test skips, or fails under
``BLOCKPOOL_REQUIRE_VLLM=1`` (``make test``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.vllm_envs import vllm016_python

VLLM_SDIST = "vllm==0.16.0"
DASHBOARDS = (
    "examples/online_serving/prometheus_grafana/grafana.json",
    "examples/online_serving/dashboards/grafana/performance_statistics.json",
    "examples/online_serving/dashboards/grafana/query_statistics.json",
)


def _missing(problem: str) -> None:
    if os.environ.get("BLOCKPOOL_REQUIRE_VLLM") == "1":
        pytest.fail(problem, pytrace=False)
    pytest.skip(problem)


def prometheus_binary() -> str:
    path = os.environ.get("BLOCKPOOL_PROMETHEUS") or shutil.which("prometheus")
    if not path:
        _missing("no prometheus binary (apt-get install -y prometheus, or BLOCKPOOL_PROMETHEUS)")
    assert path is not None
    return path


def _sdist_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "blockpool"
    return Path(os.environ.get("BLOCKPOOL_VLLM_SDIST_DIR") or default / "vllm-sdist")


def vllm_sdist() -> Path:
    """vLLM 0.16.0's source distribution, downloaded by pip once.  pip
    prepares its metadata, which runs vLLM's setup.py: in the vLLM 0.16.0
    environment (torch), without build isolation (its build pins a CUDA
    torch), as the device-less target, setuptools_scm put beside it."""
    where = _sdist_dir()
    got = sorted(where.glob("vllm-0.16.0.tar.gz"))
    if got:
        return got[0]
    python = vllm016_python()
    where.mkdir(parents=True, exist_ok=True)
    tools = where / "build-tools"
    env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": "0.16.0"}
    env["PYTHONPATH"] = str(tools)
    steps = [
        [python, "-m", "pip", "install", "-q", "--target", str(tools), "setuptools_scm"],
        [python, "-m", "pip", "download", VLLM_SDIST, "--no-deps", "--no-binary", ":all:",
         "--no-build-isolation", "-d", str(where)],
    ]  # fmt: skip
    for cmd in steps:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        if done.returncode != 0:
            _missing(f"{' '.join(cmd[1:5])}: {done.stderr.strip()[-600:]}")
    got = sorted(where.glob("vllm-0.16.0.tar.gz"))
    if not got:
        _missing(f"pip left no vllm-0.16.0.tar.gz in {where}")
    return got[0]


def dashboard_queries() -> dict[str, list[str]]:
    """Dashboard file -> its PromQL expressions, in order (non-empty)."""
    out: dict[str, list[str]] = {}
    with tarfile.open(vllm_sdist()) as tar:
        for name in DASHBOARDS:
            f = tar.extractfile(f"vllm-0.16.0/{name}")
            assert f is not None, name
            exprs: list[str] = []
            _exprs(json.load(f), exprs)
            assert exprs, f"no query in {name}"
            out[name] = exprs
    return out


def _exprs(node: Any, out: list[str]) -> None:
    if isinstance(node, dict):
        e = node.get("expr")
        if isinstance(e, str) and e.strip():
            out.append(e)
        for v in node.values():
            _exprs(v, out)
    elif isinstance(node, list):
        for v in node:
            _exprs(v, out)


def grafana_vars(expr: str, values: dict[str, str]) -> str:
    """Grafana's template variables ($name, ${name}) replaced by ``values``."""
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, f"a variable left in {expr!r}"
    return expr


SELECTOR = re.compile(r"(vllm:[A-Za-z0-9_:]+)(\{[^}]*\})?")


def only_job(expr: str, job: str) -> str:
    """``expr`` with every vLLM series selector restricted to ``job``."""

    def one(m: re.Match[str]) -> str:
        inner = (m.group(2) or "{}")[1:-1].strip()
        return f'{m.group(1)}{{job="{job}"{"," + inner if inner else ""}}}'

    return SELECTOR.sub(one, expr)


class Prometheus:
    """One Prometheus scraping ``targets`` (job -> host:port) every second."""

    def __init__(self, workdir: Path, targets: dict[str, str], port: int) -> None:
        self.workdir = workdir
        self.port = port
        config = workdir / "prometheus.yml"
        jobs = "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            for job, addr in targets.items()
        )
        config.write_text(
            f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}"
        )
        self.log_path = workdir / "prometheus.log"
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            return self.client.get("/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str, at: float) -> dict[str, Any]:
        r = self.client.get("/api/v1/query", params={"query": expr, "time": f"{at:.3f}"})
        body: dict[str, Any] = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        data: dict[str, Any] = body["data"]
        return data

    def names(self, job: str) -> set[str]:
        """The series names scraped from ``job`` (Prometheus' own per-target
        series, ``up`` and ``scrape_*``, left out)."""
        r = self.client.get("/api/v1/label/__name__/values", params={"match[]": f'{{job="{job}"}}'})
        got = set(r.json()["data"])
        return {n for n in got if n != "up" and not n.startswith("scrape_")}

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(30)
