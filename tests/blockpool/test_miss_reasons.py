"""The one miss-reason tally: the four-reason arithmetic of a replay, the
per-block codes of the analysis, the view by name, the stored-prefix search."""

from __future__ import annotations

import random

import pytest

from blockpool.common.miss_reasons import (
    COLD,
    EVICTED,
    FLOOR,
    HIT,
    LAST_TOKEN,
    REPLAY_REASONS,
    MissTally,
    ReasonCounts,
    first_unstored,
)


def test_a_prompts_blocks_each_get_one_reason() -> None:
    t = MissTally()
    # 10 full blocks and a partial one: 3 hit, the 4th cached but holding the
    # last token, 7 stored before (so 3 evicted since), the last 3 never stored
    t.add(hit=3, seen=7, full=10, last_token=1, partial=1)
    assert t.counts(REPLAY_REASONS) == {
        "last_token": 1, "block_size_floor": 1, "cold": 3, "evicted": 3}  # fmt: skip
    assert t.blocks[HIT] == 3 and t.regret_blocks == 3
    assert sum(t.blocks) == 10 + 1  # every block once, the partial one included
    sums = MissTally()  # the one-pass curve's sums over prompts
    sums.add_counts(last_token=1, floor=1, evicted=3, cold=3)
    assert sums.counts(REPLAY_REASONS) == t.counts(REPLAY_REASONS)
    assert sums.regret_blocks == 3


def test_codes_and_names_agree() -> None:
    t = MissTally()
    counts = t.add_codes(bytes([HIT, HIT, LAST_TOKEN, EVICTED, COLD, COLD, FLOOR]))
    assert counts[HIT] == 2 and counts[COLD] == 2 and sum(counts) == 7
    view = ReasonCounts(t, REPLAY_REASONS)
    assert dict(view) == {"last_token": 1, "block_size_floor": 1, "cold": 2, "evicted": 1}
    view["cold"] = 5  # a live view: it writes the tally
    assert t.blocks[COLD] == 5 and view["cold"] == 5 and len(view) == 4
    with pytest.raises(KeyError):
        view["extra_keys"]  # not one of the view's names
    other = MissTally()
    other.add_codes(bytes([HIT, HIT, LAST_TOKEN, EVICTED, COLD, COLD, FLOOR]))
    assert other != t
    other.blocks[COLD] = 5
    assert other == t


def test_the_first_unstored_hash_is_found_by_bisection() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(0, 40)
        chain = list(range(n))
        k = rng.randint(0, n)
        stored = set(chain[:k])
        lo = rng.randint(0, k)
        assert first_unstored(chain, lo, n, stored) == k
