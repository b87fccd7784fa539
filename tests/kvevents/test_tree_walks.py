"""The observer's prefix tree is walked by the same code as the runtime's
(``blockpool.runtime.prefix_tree``): fed the same events, both give the same
children, depths and breadth-first order."""

from __future__ import annotations

from app.observer.source import Source
from blockpool.kvevents.config import SourceSpec
from blockpool.runtime.prefix_tree import EventPrefixTree, breadth_first
from tests.kvevents.helpers import Workload, positional


def test_the_observer_and_the_runtime_tree_agree_on_the_same_events() -> None:
    w = Workload(seed=77, lora=False)
    batches = w.batches(120)
    s = Source(SourceSpec("s", "tcp://127.0.0.1:1", None, 0))
    tree = EventPrefixTree()
    for i, evs in enumerate(batches):
        s.feed_live(i, positional(evs))
        for ev in evs:
            tree.apply(ev)
    state = s.state
    state.check()
    assert len(tree) == len(state.entries) > 0
    ours = {p: sorted(c) for p, c in state.children().items()}
    assert ours == {p: sorted(c) for p, c in tree.children().items()}
    depths = state.depths()
    assert depths == tree.depths()
    assert max(d for _, d in depths.values()) > 1  # chains, not only roots
    walk = breadth_first(state.children(), 10_000)
    assert sorted(h for h, _ in walk) == sorted(state.entries)
    assert [d for _, d in walk] == sorted(d for _, d in walk)  # level by level
    assert all(depths[h][1] == d for h, d in walk)
    assert len(breadth_first(state.children(), 5)) == 5
    w.check()
