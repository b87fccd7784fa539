"""The wait before trying again (blockpool/common/backoff.py): doubled after
each failure up to its bound, the first again after a reset; a bound below
the first wait, or a wait of 0, refused."""

from __future__ import annotations

import pytest

from blockpool.common.backoff import Backoff


def test_each_failure_doubles_the_wait_up_to_the_bound_and_a_reset_starts_over() -> None:
    b = Backoff(0.05, 0.3)
    assert [b.failed() for _ in range(5)] == [0.05, 0.1, 0.2, 0.3, 0.3]
    b.reset()
    assert b.failed() == 0.05 and b.next_s == 0.1


@pytest.mark.parametrize(("first", "most"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_backoff_that_would_not_wait_or_shrink_is_refused(first: float, most: float) -> None:
    with pytest.raises(ValueError, match="0 < first <= most"):
        Backoff(first, most)
