"""The compose file (docker/compose.yaml), through ``docker-compose config``:
it accepts the file with and without the ``gpu`` profile, and its normalized
model pins every image, has a health check on every service, binds the
documented ports, and wires the app, the load generators and the GPU
profile as documented."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.shared.settings import Settings
from tests.docker.helpers import (
    COMPOSE,
    DOCKER,
    ROOT,
    compose_model,
    instructions_text,
    run_tool,
    tool,
)


@pytest.mark.parametrize("profiles", [(), ("gpu",)], ids=["default", "gpu"])
def test_compose_config_is_valid(profiles: tuple[str, ...]) -> None:
    args: list[str | Path] = [tool("docker-compose"), "-f", COMPOSE]
    for p in profiles:
        args += ["--profile", p]
    proc = run_tool(*args, "config", "-q")
    assert proc.returncode == 0, proc.stderr
    assert "warn" not in proc.stderr.lower(), proc.stderr


def test_compose_services() -> None:
    assert set(compose_model()["services"]) == {
        "app", "loadgen", "observer", "prometheus", "grafana"
    }  # fmt: skip
    assert set(compose_model("gpu")["services"]) == {
        "app", "loadgen", "observer", "prometheus", "grafana", "app-gpu", "loadgen-gpu",
    }  # fmt: skip


def test_every_image_is_pinned(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        image = svc.get("image")
        assert image, f"{name}: no image name (a build needs one, with a tag)"
        ref = image.split("@", 1)[0]
        _, sep, tag = ref.rpartition(":")
        assert sep and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image} uses :latest"
        if "build" not in svc:
            assert re.search(r"\d", tag), f"{name}: {image}: pin a version, not a moving tag"


def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        hc = svc.get("healthcheck")
        assert hc and not hc.get("disable"), f"{name}: no health check"
        test = hc["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, f"{name}: {test}"
        assert hc.get("interval") and hc.get("timeout") and hc.get("retries"), name


def test_ports_are_the_documented_ones(compose: dict[str, Any]) -> None:
    expected = {
        "app": (8000, 8000), "app-gpu": (8001, 8000), "observer": (8002, 8002),
        "prometheus": (9090, 9090), "grafana": (3000, 3000),
    }  # fmt: skip
    for name, svc in compose["services"].items():
        ports = svc.get("ports", [])
        if name not in expected:
            assert not ports, f"{name} publishes {ports}: it serves nothing"
            continue
        assert len(ports) == 1, f"{name}: {ports}"
        (p,) = ports
        assert (int(p["published"]), int(p["target"])) == expected[name], p
        # Loopback unless BLOCKPOOL_BIND says otherwise: the demo has no auth.
        assert p.get("host_ip") == "127.0.0.1", p
    doc = (DOCKER / "README.md").read_text()
    for port in ("8000", "8002", "9090", "3000"):
        assert f"localhost:{port}" in doc, f"docker/README.md does not document port {port}"


def test_app_service(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    app = compose["services"]["app"]
    assert app["build"]["dockerfile"] == "docker/Dockerfile"
    assert Path(app["build"]["context"]).resolve() == ROOT
    env = app["environment"]
    assert env["BLOCKPOOL_PORT"] == "8000" and env["BLOCKPOOL_HOST"] == "0.0.0.0"
    assert env["BLOCKPOOL_DEMO"] == "true"
    # Read as the container reads them: from its environment.
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = Settings()
    assert settings.port == 8000 and settings.demo
    assert "/api/health" in " ".join(app["healthcheck"]["test"])


@pytest.mark.parametrize(("name", "target"), [("loadgen", "app"), ("loadgen-gpu", "app-gpu")])
def test_loadgen_service(compose: dict[str, Any], name: str, target: str) -> None:
    svc = compose["services"][name]
    assert svc["environment"]["BLOCKPOOL_URL"] == f"http://{target}:8000"
    assert svc["depends_on"][target]["condition"] == "service_healthy"
    assert svc["entrypoint"] == ["python", "/opt/loadgen/loadgen.py"]
    # The image that carries the script is built here, never pulled.
    assert svc["build"]["dockerfile"] == "docker/Dockerfile"
    assert svc["image"] == compose["services"]["app"]["image"]
    heartbeat = svc["environment"]["LOADGEN_HEARTBEAT"]
    assert heartbeat in " ".join(svc["healthcheck"]["test"])
    assert "COPY docker/loadgen /opt/loadgen" in instructions_text(DOCKER / "Dockerfile")


def test_gpu_profile(compose: dict[str, Any]) -> None:
    for name in ("app-gpu", "loadgen-gpu"):
        assert compose["services"][name]["profiles"] == ["gpu"]
    gpu = compose["services"]["app-gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    assert gpu["image"].endswith("-cuda")
    (dev,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"]
    assert gpu["environment"]["BLOCKPOOL_STORAGE_DEVICE"] == "cuda"
    assert gpu["environment"]["BLOCKPOOL_MODEL_NAME"] != "blockpool-demo"
