"""What a machine changes in the compose demo through variables (image
names, host ports, torch version and index; today's values by default), the
override for machines that reach no registry (docker/compose.local.yaml),
and F1: Prometheus scrapes the observer by its compose service name."""

from __future__ import annotations

import asyncio
import json

import httpx
import yaml

from app.observer.app import create_observer_app
from app.shared.settings import ObserverSettings
from tests.docker.helpers import COMPOSE, COMPOSE_LOCAL, PROMETHEUS_YML, compose_model

IMAGES = {
    "app": "blockpool:0.1.0-cpu", "loadgen": "blockpool:0.1.0-cpu",
    "observer": "blockpool:0.1.0-cpu", "prometheus": "prom/prometheus:v3.5.0",
    "grafana": "grafana/grafana:12.2.1", "app-gpu": "blockpool:0.1.0-cuda",
    "loadgen-gpu": "blockpool:0.1.0-cpu",
}  # fmt: skip
PORTS = {"app": 8000, "observer": 8002, "prometheus": 9090, "grafana": 3000, "app-gpu": 8001}


def published(model: dict[str, object]) -> dict[str, int]:
    services = model["services"]
    assert isinstance(services, dict)
    return {n: int(s["ports"][0]["published"]) for n, s in services.items() if s.get("ports")}


def test_defaults_are_todays_values() -> None:
    model = compose_model("gpu")
    assert {n: s["image"] for n, s in model["services"].items()} == IMAGES
    assert published(model) == PORTS
    args = model["services"]["app"]["build"]["args"]
    assert args == {"TORCH_VERSION": "2.13.0",
                    "TORCH_INDEX_URL": "https://download.pytorch.org/whl/cpu"}  # fmt: skip
    assert model["services"]["app-gpu"]["build"]["args"] == {"TORCH_VERSION": "2.13.0"}
    fleet = model["services"]["app"]["environment"]["BLOCKPOOL_FLEET_URL"]
    assert fleet == "http://localhost:8002/"


def test_variables_move_images_ports_and_torch() -> None:
    env = {
        "BLOCKPOOL_IMAGE": "reg.example/bp:7", "BLOCKPOOL_CUDA_IMAGE": "reg.example/bp:7-cuda",
        "PROMETHEUS_IMAGE": "mirror.example/prometheus:2.42", "GRAFANA_IMAGE": "g.example/g:1",
        "BLOCKPOOL_APP_PORT": "18000", "BLOCKPOOL_OBSERVER_PORT": "18002",
        "PROMETHEUS_PORT": "19090", "GRAFANA_PORT": "13000", "BLOCKPOOL_GPU_PORT": "18001",
        "TORCH_VERSION": "", "TORCH_INDEX_URL": "http://127.0.0.1:3141/simple",
    }  # fmt: skip
    model = compose_model("gpu", env=env)
    images = {n: s["image"] for n, s in model["services"].items()}
    assert images == {
        "app": "reg.example/bp:7", "loadgen": "reg.example/bp:7", "observer": "reg.example/bp:7",
        "loadgen-gpu": "reg.example/bp:7", "app-gpu": "reg.example/bp:7-cuda",
        "prometheus": "mirror.example/prometheus:2.42", "grafana": "g.example/g:1",
    }  # fmt: skip
    assert published(model) == {
        "app": 18000, "observer": 18002, "prometheus": 19090, "grafana": 13000, "app-gpu": 18001
    }  # fmt: skip
    # TORCH_VERSION set but empty: no torch (the Dockerfile skips it), not the default
    assert model["services"]["app"]["build"]["args"] == {
        "TORCH_VERSION": "", "TORCH_INDEX_URL": "http://127.0.0.1:3141/simple"
    }  # fmt: skip
    env_app = model["services"]["app"]["environment"]
    assert env_app["BLOCKPOOL_FLEET_URL"] == "http://localhost:18002/"


def test_the_local_override_builds_on_the_host_network_and_puts_grafana_in_a_profile() -> None:
    files = (COMPOSE, COMPOSE_LOCAL)
    model = compose_model(files=files)
    assert "grafana" not in model["services"]
    for name in ("app", "loadgen", "observer"):
        build = model["services"][name]["build"]
        assert build["network"] == "host" and build["dockerfile"] == "docker/Dockerfile", name
    with_grafana = compose_model("grafana", files=files)
    assert with_grafana["services"]["grafana"]["image"] == IMAGES["grafana"]
    # everything else is compose.yaml's own
    plain = compose_model()
    for name, svc in model["services"].items():
        svc = {**svc, "build": {k: v for k, v in svc.get("build", {}).items() if k != "network"}}
        want = {**plain["services"][name], "build": plain["services"][name].get("build", {})}
        assert svc == want, name


def test_prometheus_scrapes_the_observer_by_its_service_name() -> None:
    """F1: the observer's Host check lets its compose name in (and only the
    names it is given): Prometheus's ``observer:8002`` scrape is answered."""
    prom = yaml.safe_load(PROMETHEUS_YML.read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "blockpool-observer"]
    (target,) = job["static_configs"][0]["targets"]
    assert target == "observer:8002"

    env = compose_model()["services"]["observer"]["environment"]
    allowed = json.loads(env["BLOCKPOOL_OBSERVER_ALLOWED_HOSTS"])
    assert allowed == ["observer"]
    app = create_observer_app(ObserverSettings(endpoints=["app=tcp://app:5557"],
                                               allowed_hosts=allowed))  # fmt: skip

    async def scrape(host: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return await c.get("/metrics", headers={"host": host})

    ok = asyncio.run(scrape(target))
    assert ok.status_code == 200, ok.text
    assert 'blockpool_observer_connected{pool="app"} 0.0' in ok.text
    refused = asyncio.run(scrape("rebound.example:8002"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_refused"
    # without the compose setting, the same scrape is refused (the bug)
    bare = create_observer_app(ObserverSettings(endpoints=["app=tcp://app:5557"]))
    transport = httpx.ASGITransport(app=bare)

    async def bare_scrape() -> int:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            return (await c.get("/metrics", headers={"host": target})).status_code

    assert asyncio.run(bare_scrape()) == 403


def test_the_vllm_profile_is_scraped_by_the_names_its_services_answer_to() -> None:
    model = compose_model("vllm")
    services = model["services"]
    assert {"vllm", "mirror", "observer-vllm", "vllm-load"} <= set(services)
    assert {n: p for n, p in published(model).items() if n not in PORTS} == {
        "vllm": 8650, "mirror": 8003, "observer-vllm": 8004
    }  # fmt: skip
    engine = services["vllm"]
    assert engine["build"]["dockerfile"] == "docker/Dockerfile.vllm"
    assert int(engine["shm_size"]) >= 160 * 1024 * 1024  # vLLM's shared-memory queue
    assert engine["environment"]["BLOCKPOOL_MIRROR_ENDPOINT"] == "tcp://*:5590"
    assert services["mirror"]["command"][:3] == ["serve", "--mirror", "tcp://vllm:5590"]
    assert services["vllm-load"]["environment"]["VLLM_URL"] == "http://vllm:8650"
    # every scrape job of the profile reaches a service that lets its name in
    prom = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    for job, service, var in (
        ("blockpool-mirror", "mirror", "BLOCKPOOL_ALLOWED_HOSTS"),
        ("blockpool-observer-vllm", "observer-vllm", "BLOCKPOOL_OBSERVER_ALLOWED_HOSTS"),
        ("vllm", "vllm", None),
    ):
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["names"] == [service], job
        if var:
            assert json.loads(services[service]["environment"][var]) == [service], job
    # and without the profile, none of it runs
    assert not {"vllm", "mirror", "observer-vllm", "vllm-load"} & set(compose_model()["services"])
