"""Shared by the docker/ checks: the paths, the tools of the dev extra (run
with the compose defaults, not this shell's), the compose model, the
Dockerfiles' instructions, Grafana's Prometheus datasource, and the labels
and metrics the dashboard checks know about."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_LOCAL = DOCKER / "compose.local.yaml"  # machines without a registry
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cuda"]
# The `vllm` profile's engine, and the Debian stand-in for prom/prometheus
# that make demo-check builds where no registry is reachable.
OTHER_DOCKERFILES = [DOCKER / "Dockerfile.vllm", DOCKER / "local" / "Dockerfile.prometheus"]
DASHBOARD = DOCKER / "grafana" / "dashboards" / "blockpool.json"
PROMETHEUS_YML = DOCKER / "prometheus" / "prometheus.yml"
DATASOURCES = DOCKER / "grafana" / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = DOCKER / "grafana" / "provisioning" / "dashboards"
LOADGEN = DOCKER / "loadgen" / "loadgen.py"
BIN = Path(sys.executable).parent

MODEL = "test-model"  # the live app's model_name; stands in for $model_name

# Metrics documented as the stream's (app/stream): the dashboard's "Stream
# health" row uses them.  While the stream is not wired into /metrics yet, a
# live app exposes no blockpool_stream_* at all and only these are excused;
# once any blockpool_stream_* series exists, all of them must.
STREAM_METRICS = {
    "blockpool_stream_clients",
    "blockpool_stream_frames_total",
    "blockpool_stream_bytes_total",
    "blockpool_stream_drops_total",
    "blockpool_stream_resyncs_total",
    "blockpool_stream_max_lag_frames",
}
# Labels Prometheus attaches to every scraped series (the target's labels).
TARGET_LABELS = {"job", "instance", "variant"}


def tool(name: str) -> Path:
    """A tool installed in the venv's bin dir (the dev extra): fail, never skip."""
    path = BIN / name
    assert path.is_file(), f"{path} is missing: install the dev extra (pip install -e '.[dev]')"
    return path


COMPOSE_VARS = (
    "BLOCKPOOL_", "LOADGEN_", "GRAFANA_", "PROMETHEUS_", "TORCH_", "COMPOSE_", "DOCKER_",
)  # fmt: skip


def run_tool(
    *args: str | Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # The compose file's defaults (and ``env``), not whatever this shell exports.
    env = {k: v for k, v in os.environ.items() if not k.startswith(COMPOSE_VARS)} | (env or {})
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def compose_model(
    *profiles: str, env: dict[str, str] | None = None, files: tuple[Path, ...] = (COMPOSE,)
) -> dict[str, Any]:
    args: list[str | Path] = [tool("docker-compose")]
    for f in files:
        args += ["-f", f]
    for p in profiles:
        args += ["--profile", p]
    proc = run_tool(*args, "config", "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    model: dict[str, Any] = json.loads(proc.stdout)
    return model


def datasource() -> dict[str, Any]:
    files = sorted(DATASOURCES.glob("*.yml"))
    assert files, "no Grafana datasource provisioning file"
    sources = [d for f in files for d in yaml.safe_load(f.read_text())["datasources"]]
    (prom,) = [d for d in sources if d["type"] == "prometheus"]
    return prom


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: unfinished continuation"
    return out


def instructions_text(path: Path) -> str:
    return "\n".join(f"{i} {a}" for i, a in instructions(path))


def final_stage(path: Path) -> list[tuple[str, str]]:
    ins = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    return ins[last_from:]
