"""A fleet sweep as Ray tasks on a local Ray started on loopback equals the
serial sweep.  Ray is in the dev extra: without it this test fails (never skips)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray

from blockpool.trace.fleet import FleetJob, FleetSpec, run_sweep
from blockpool.trace.fleet.routers import ROUTERS
from tests.trace.fleet_traces import conversation_trace


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()


def test_a_ray_sweep_equals_the_serial_sweep(local_ray: None) -> None:  # noqa: ARG001 fixture starts ray
    trace = conversation_trace()
    spec = FleetSpec(block_size=16)
    jobs = [
        FleetJob(n, str(c), c, r, "append_all") for n in (1, 3) for c in (24, 80) for r in ROUTERS
    ]
    serial = run_sweep(trace, spec, jobs, executor="serial")
    seen: list[int] = []
    on_ray = run_sweep(trace, spec, jobs, executor="ray", done=lambda k, t: seen.append(k))  # noqa: ARG005 the done callback's signature
    assert [r.to_json() for r in on_ray] == [r.to_json() for r in serial]
    assert seen == list(range(1, len(jobs) + 1))
    assert ray.is_initialized()  # the sweep used the Ray it found, and left it up
