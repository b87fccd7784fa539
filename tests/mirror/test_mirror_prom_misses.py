"""A mirror's ``/metrics`` miss reasons are its engine's: the Prometheus
families ``blockpool_prefix_misses_total`` (by reason),
``blockpool_prefix_miss_tokens_total`` and ``blockpool_prefix_hit_blocks_total``
count the engine's requests as the page and GET /api/misses do (the board
beside vLLM's and the evicted-miss alert read them), with the analysis inline
or in its worker."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blockpool.common.miss_reasons import REASONS
from tests.app.conftest import running
from tests.mirror.rig import Rig

pytestmark = pytest.mark.anyio


def samples(text: str) -> dict[tuple[str, str], float]:
    """(sample name, reason or "") -> value."""
    return {
        (s.name, s.labels.get("reason", "")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


@pytest.mark.parametrize("mode", ["inline", "worker"])
async def test_the_mirrors_miss_families_count_the_engines_requests(rig: Rig, mode: str) -> None:
    engine = rig.engine
    engine.tell_requests = True
    engine.admit_alone = True
    hello = await rig.hello()
    app, client = rig.service(hello, analysis_mode=mode)
    async with running(app) as api:
        await rig.drive(client, 40, 5)
        got = await api.ok("GET", "/api/misses")
        r = await api.client.get("/metrics")
        assert r.status_code == 200
        m = samples(r.text)
        tally = client.misses
        assert tally.admissions > 0 and sum(tally.blocks[1:]) > 0
        for code, reason in enumerate(REASONS, start=1):
            assert m["blockpool_prefix_misses_total", reason] == tally.blocks[code], reason
            assert m["blockpool_prefix_miss_tokens_total", reason] == tally.tokens[code], reason
            assert got["reasons"][reason]["blocks"] == tally.blocks[code], reason
        assert m["blockpool_prefix_hit_blocks_total", ""] == tally.blocks[0]
        assert m["blockpool_prefix_misses_total", "evicted"] > 0  # the pool overflowed
    app.state.engine.check()
    engine.rt.check()
