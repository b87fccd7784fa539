"""The plugin says how far its digest is behind (``DigestReading``, in its
handshake and beats): the blocks batches named that the digest has not read
yet, a rebuild's rows left, and the shortest of the engine's last forward
passes -- the time its thread reads in.  An engine whose scheduling is longer
than its passes (vLLM's async scheduling on a busy, slow host) never waits
for them: the plugin takes no digest, and the mirror shows why instead of
"verifying" with no word."""

from __future__ import annotations

from blockpool.mirror.digest import pool_digest
from blockpool.runtime.ops import AllocateOp, FreeOp
from blockpool_vllm.forward_pass import KEPT
from tests.mirror.workload import FollowedEngine, passes_of


def test_the_reading_counts_the_blocks_not_read_and_the_passes_to_read_in() -> None:
    engine = FollowedEngine(num_blocks=1024, defer_digest=True, windowed=True)
    f = engine.follower
    r = f.reading()
    assert r is not None and r.behind == 0 and r.sweep_left is None and r.taken == 0
    assert r.discarded == 0 and r.stopped == 0  # counted from the start: said, as 0
    assert r.overrun == 0 and r.planned_too_long == 0
    assert r.window_us is None  # no pass seen yet: not known, not 0
    held: list[int] = []
    for _ in range(3):
        got = engine.rt.apply(AllocateOp(num_blocks=7))
        if held:
            engine.rt.apply(FreeOp(block_ids=held[:3]))
        held = list(got["block_ids"])
        f.flush()  # (prepared as the sender's thread does: the blocks pending)
    named = sum(map(len, f.reader.pending))
    assert named == 21  # 3 x 7 allocated (the 6 freed were waiting already)
    r = f.reading()
    assert r is not None and r.behind == named and r.taken == 0
    # passes too short to read in (an engine that never waits): ~30 µs each
    passes_of(engine, [30_000] * (KEPT + 1))
    r = f.reading()
    assert r is not None and r.window_us is not None and 30.0 <= r.window_us < 1_000.0
    assert not f.catch_up()  # no pass running: nothing read
    assert f.reading() == r
    # a long pass: the digest read, the reading says so
    passes_of(engine, [50_000_000] * KEPT)
    f.passes.begins()
    f.passes.began -= 1_000_000
    f.passes.plan()
    assert f.catch_up()
    r = f.reading()
    assert r is not None and r.behind == 0 and r.taken == 1
    assert (r.discarded, r.stopped) == (f.reader.digests_discarded, f.reader.readings_stopped)
    assert (r.overrun, r.planned_too_long) == (f.reader.windows_overrun, f.passes.tokens_misses)
    assert r.window_us is not None and 50_000.0 <= r.window_us < 51_000.0
    assert f.digest.value == pool_digest(engine.rt.pool)
    engine.rt.check()


def test_a_rebuild_due_reads_as_every_row_left() -> None:
    engine = FollowedEngine(num_blocks=512, defer_digest=True, windowed=True)
    f = engine.follower
    f.reader.sweep_due = True
    r = f.reading()
    assert r is not None and r.sweep_left == f.digest.n
    engine.rt.check()


def test_a_digest_on_the_engines_thread_says_nothing() -> None:
    engine = FollowedEngine(num_blocks=256, defer_digest=False)
    engine.rt.apply(AllocateOp(num_blocks=3))
    engine.follower.flush()
    assert engine.follower.reading() is None
    engine.rt.check()
