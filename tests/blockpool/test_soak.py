"""A short run of the seeded soak (the long one: python -m tests.blockpool.soak)."""

from __future__ import annotations

import pytest

from blockpool import BlockRemoved
from tests.blockpool.soak import Soak, SoakFailure, main, run_soak


@pytest.mark.parametrize(
    ("seed", "kw"),
    [
        (1, {"num_blocks": 512}),
        (2, {"num_blocks": 200, "strict": False}),
        (3, {"num_blocks": 400, "groups": 2, "block_size": 8}),
    ],
)
def test_short_soak(seed: int, kw: dict[str, object]) -> None:
    stats = run_soak(12_000, seed, check_every=150, **kw)
    # The traffic must have exercised what the soak is for.
    assert stats["ops"] == 12_000 and stats["checks"] >= 80
    assert stats["admitted"] > 1000 and stats["refused"] > 0 and stats["preempted"] > 0
    assert 0 < stats["hit_tokens"] < stats["query_tokens"]
    assert stats["removed_events"] > 0 and stats["stored_events"] > 0
    assert stats["resets"] > 0 and stats["resets_refused"] > 0 and stats["evict_calls"] > 0
    assert stats["metric_samples"] > 0


def test_same_seed_same_run() -> None:
    a, b = run_soak(2000, 9), run_soak(2000, 9)
    assert a == b
    assert run_soak(2000, 10) != a


def test_the_soak_notices_a_wrong_ref_count() -> None:
    soak = Soak(4, num_blocks=256)
    soak.run(500)
    for _ in range(50):
        soak.step()
    held = [b for b in soak.pool.blocks[1:] if b.ref_cnt > 0]
    assert held
    held[0].ref_cnt += 1
    with pytest.raises(SoakFailure, match="ref counts differ"):
        soak.check()


def test_the_soak_notices_a_lost_event() -> None:
    soak = Soak(5, num_blocks=256)
    for _ in range(300):
        soak.step()
    soak.check()
    key = next(iter(soak.pool.cached_block_hash_to_block._cache))
    soak.mirror[int.from_bytes(key[-12:-4], "big")] += 1  # a BlockRemoved never seen
    with pytest.raises(SoakFailure, match="mirror differs"):
        soak.check()


def test_the_soak_rejects_a_removal_of_something_never_stored() -> None:
    soak = Soak(6, num_blocks=64)
    soak.pool.kv_event_queue.append(BlockRemoved([12345], "GPU"))
    with pytest.raises(SoakFailure, match="never stored"):
        soak._consume_events()


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ops", "3000", "--seed", "3", "--blocks", "256", "--check-every", "500"]) == 0
    out = capsys.readouterr().out
    assert "soak: seed 3, 3000 ops, 256 blocks" in out
    assert "ok in" in out and "3000 ops:" in out
