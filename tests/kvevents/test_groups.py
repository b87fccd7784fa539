"""Hybrid models (vLLM >= 0.24): events carry their KV-cache group, and the
observer keeps its state per (group_idx, hash) -- over real ZMQ sockets, the
full-attention and sliding-window groups of one instance fed by two real
pools serving the same prompts (so they share hashes, as a hybrid model's
groups do), each group's map equal to its pool's."""

from __future__ import annotations

import asyncio

import pytest

from app.observer.fleet import Fleet
from app.observer.source import Source
from blockpool import AllBlocksCleared
from blockpool.kvevents.config import SourceSpec
from blockpool.kvevents.observed import RemovedEvent, StoredEvent
from blockpool.kvevents.state import InstanceState
from tests.kvevents.helpers import await_for, fake_publisher, vllm_current
from tests.kvevents.test_observer import settled, shared_workloads


def test_state_per_group_and_hash_over_sockets() -> None:
    full, window = shared_workloads(2)
    steps: list[tuple[int, bytes]] = []
    unknown_sent = 0
    for _ in range(60):
        for group, w in ((0, full), (1, window)):
            evs = w.step()
            if evs:
                unknown_sent += sum(1 for e in evs if not isinstance(e, AllBlocksCleared))
                kind, win = ("full_attention", None) if group == 0 else ("sliding_window", 8)
                steps.append(
                    (group, vllm_current(evs, group, kind, win, unknown={"future_field": 1}))
                )

    async def main() -> None:
        with fake_publisher() as fp:
            fleet = Fleet([Source(SourceSpec("hybrid", fp.endpoint, fp.replay_endpoint, 0))])
            await fleet.start()
            s = fleet.sources["hybrid"]
            try:
                await await_for(lambda: s.connected, what="the SUB to connect")
                await asyncio.to_thread(fp.wait_subscribed)
                for seq, (_, payload) in enumerate(steps):
                    fp.send(seq, payload)
                await settled(s, len(steps) - 1)
                want = {(0, h): n for h, n in full.pool_copies().items()}
                want.update({(1, h): n for h, n in window.pool_copies().items()})
                assert s.state.group_copies() == want
                shared = set(full.pool_copies()) & set(window.pool_copies())
                assert shared, "the groups share hashes, as a hybrid model's do"
                for h in shared:
                    assert s.state.entries[h].copies == (
                        full.pool_copies()[h] + window.pool_copies()[h]
                    )
                assert s.tracker.exact
                health = s.health()
                assert health["groups"] == {
                    "0": sum(full.pool_copies().values()),
                    "1": sum(window.pool_copies().values()),
                }
                assert health["group_specs"] == {
                    "0": {"kind": "full_attention", "sliding_window": None},
                    "1": {"kind": "sliding_window", "sliding_window": 8},
                }
                # the field no release sends: kept on every event, counted
                assert health["unknown_fields"] == {"future_field": unknown_sent}
                assert health["unknown_fields_total"] == unknown_sent > 0
                ev = s.log.since(0, 1)[0][0][2][1]
                assert ev.extra is not None and ev.extra["future_field"] == 1
                s.state.check()
            finally:
                await fleet.stop()
        full.check()
        window.check()

    asyncio.run(main())


@pytest.mark.parametrize("group", [None, 0])
def test_a_removal_names_its_group_or_the_only_one_held(group: int | None) -> None:
    st = InstanceState()
    ev = StoredEvent([1, 2], None, [5, 6], 1, group=0)
    st.apply([ev, StoredEvent([1], None, [5], 1, group=1)], 0, 1.0)
    assert st.group_copies() == {(0, 1): 1, (0, 2): 1, (1, 1): 1}
    # hash 2 is held in one group only: a removal without a group takes it
    st.apply([RemovedEvent([2], group=group)], 1, 2.0)
    assert (0, 2) not in st.group_copies() and st.unknown_removals == 0
    # hash 1 is in two groups: a removal must say which
    st.apply([RemovedEvent([1], group=None)], 2, 3.0)
    assert st.unknown_removals == 1 and st.group_copies()[(1, 1)] == 1
    st.apply([RemovedEvent([1], group=1)], 3, 4.0)
    assert st.group_copies() == {(0, 1): 1} and st.group_blocks == {0: 1}
    st.check()
