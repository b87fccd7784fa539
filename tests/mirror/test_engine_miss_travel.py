"""The evicted misses' age and queue travel on a mirror (the page's two
charts): the engine's requests' evicted blocks, as the simulated pool's own
analysis counts them for the same requests."""

from __future__ import annotations

import pytest

from blockpool.analysis.core import Analysis
from tests.mirror.test_engine_misses import follow, mirror
from tests.mirror.workload import FollowedEngine


@pytest.mark.parametrize("free_order", ["append_all", "uncached_first"])
def test_the_evicted_misses_travel_as_the_simulated_pools(free_order: str) -> None:
    engine = FollowedEngine(free_order=free_order)
    engine.tell_requests = True
    engine.admit_alone = True
    own = Analysis(engine.rt, miss_index_size=1 << 16, miss_finished_kept=1 << 12)
    engine.rt.observe(own)
    engine.drive(300)
    own.misses.process()  # the simulated analysis' tick
    want_pos = own.misses.miss_pos.as_json()
    want_allocs = own.misses.miss_allocs.as_json()
    assert want_pos["count"] > 5, want_pos
    for inline in (True, False):  # the analysis' ring shared, or one of its own
        rt, applier, misses = mirror(engine, inline=inline)
        assert misses.view()["evicted_misses"]["ago_seconds"]["count"] == 0
        reasons = follow(rt, applier, misses, engine.batches)
        got = misses.view()["evicted_misses"]
        # every evicted miss has an age, one per block classified ``evicted``
        # (none evicted in its own step: each admission is a step of its own)
        n_evicted = sum(r.count("evicted") for r in reasons.values())
        assert got["ago_seconds"]["count"] == n_evicted == own.misses.ago.count
        # where each had entered the free queue, and the allocations since: equal
        assert got["queue_position_when_freed"]["counts"] == want_pos["counts"], inline
        assert got["queue_position_when_freed"]["sum"] == want_pos["sum"]
        assert got["allocations_between"]["counts"] == want_allocs["counts"]
        rt.check()
    engine.rt.check()
