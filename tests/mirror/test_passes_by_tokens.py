"""Forward passes as long as their tokens make them (a GPU's prefill-heavy
steps take several times a decode step's pass): the plugin's thread plans a
pass by the shortest of the kept ones that ran from half of its tokens up to
as many -- never longer than such a pass took -- and by the shortest of all
while two such are not kept, or for a while after a pass ended before a
deadline planned so (blockpool_vllm/forward_pass.py).  On a clock the test
moves: the engine's hooks at the moments vLLM's schedulers call them."""

from __future__ import annotations

import math

from blockpool_vllm.forward_pass import (
    END_SHARE,
    GAPS_KEPT,
    KEPT,
    TOKENS_OFF_PASSES,
    ForwardPasses,
)
from tests.mirror.conftest import PassClock
from tests.mirror.workload import FollowedEngine

MS = 1_000_000
US = 1_000


def gpu_ns(tokens: int) -> int:
    """A pass on this test's GPU: 12 ms, and 2 us a token."""
    return 12 * MS + 2 * US * tokens


def engine_passes(pipelined: bool) -> ForwardPasses:
    p = ForwardPasses(True, pipelined=pipelined)
    p.last_flush = math.inf  # (never idle)
    return p


def sync_step(p: ForwardPasses, clock: PassClock, tokens: int, length: int | None = None) -> None:
    clock.ns += 3 * MS  # scheduling
    p.begins(tokens)
    clock.ns += gpu_ns(tokens) if length is None else length
    p.ends()


def planned(p: ForwardPasses, clock: PassClock, tokens: int) -> int:
    """The plan for the next pass of ``tokens``: how long after it began (ns)."""
    clock.ns += 3 * MS
    p.begins(tokens)
    p.plan()
    return p.deadline - clock.ns


MIX = [256, 8192, 256, 4096, 256, 8192, 6000, 256]  # decodes, and steps of prefills


def test_a_sync_pass_is_planned_by_the_passes_of_as_many_tokens(pass_clock: PassClock) -> None:
    clock = pass_clock
    p = engine_passes(pipelined=False)
    for t in MIX * 3:
        sync_step(p, clock, t)
    shortest = gpu_ns(256)
    assert min(p.lengths) == shortest
    # a prefill step's pass: planned by those of 4,096-8,192 tokens kept, not by a decode's
    assert planned(p, clock, 8192) == int(gpu_ns(4096) * END_SHARE)
    assert p.planned_by_tokens and p.tokens_end == p.deadline
    clock.ns += gpu_ns(8192)
    p.ends()
    assert p.tokens_misses == 0  # it ran past the deadline, as planned
    assert planned(p, clock, 7000) == int(gpu_ns(4096) * END_SHARE)
    clock.ns += gpu_ns(7000)
    p.ends()
    # a decode step's, and one of more tokens than any kept: the shortest of all
    assert planned(p, clock, 256) == int(shortest * END_SHARE)
    clock.ns += gpu_ns(256)
    p.ends()
    assert planned(p, clock, 3000) == int(shortest * END_SHARE)  # none of 1,500-3,000 kept
    assert not p.planned_by_tokens and p.tokens_end == 0
    clock.ns += gpu_ns(3000)
    p.ends()
    # a step of no tokens (nothing scheduled): the shortest
    assert planned(p, clock, 0) == int(shortest * END_SHARE)


def test_one_pass_of_as_many_tokens_is_not_enough_to_plan_by(pass_clock: PassClock) -> None:
    clock = pass_clock
    p = engine_passes(pipelined=False)
    for t in [256] * (KEPT - 1) + [8192]:
        sync_step(p, clock, t)
    # one pass of 8,192 kept (it may have waited on something else): not planned by it
    assert planned(p, clock, 8192) == int(gpu_ns(256) * END_SHARE)
    assert not p.planned_by_tokens
    clock.ns += gpu_ns(8192)
    p.ends()
    assert planned(p, clock, 8192) == int(gpu_ns(8192) * END_SHARE)  # two now
    assert p.planned_by_tokens


def test_a_pass_over_before_its_plan_by_tokens_turns_them_off_for_a_while(
    pass_clock: PassClock,
) -> None:
    clock = pass_clock
    # a GPU whose passes are not longer with more tokens (one of 8,192 as short as a decode's)
    p = engine_passes(pipelined=False)
    for t in MIX * 3:
        sync_step(p, clock, t)
    deadline_after = planned(p, clock, 8192)
    assert p.planned_by_tokens
    clock.ns += deadline_after - MS  # over 1 ms before the deadline: the thread was reading
    p.ends()
    assert p.tokens_misses == 1 and p.tokens_from == p.count + TOKENS_OFF_PASSES
    for i in range(TOKENS_OFF_PASSES - 1):  # (the GPU as before again)
        t = 8192 if i % 2 else 256
        shortest = min(p.lengths)
        assert planned(p, clock, t) == int(shortest * END_SHARE)  # the shortest of all
        assert not p.planned_by_tokens
        clock.ns += gpu_ns(t)
        p.ends()
    assert planned(p, clock, 8192) == int(gpu_ns(8192) * END_SHARE)  # and then by tokens again
    assert p.planned_by_tokens and p.tokens_misses == 1


def pipelined_step(p: ForwardPasses, clock: PassClock, tokens: int, waited_tokens: int) -> None:
    """A GPU-bound pipelined engine: a step of ``tokens`` scheduled 3 ms after the
    last wait ended, then the wait for the one before (``waited_tokens``),
    whose pass began when the last wait ended."""
    ended = clock.ns
    clock.ns = ended + 3 * MS
    p.begins(tokens)
    clock.ns = ended + gpu_ns(waited_tokens)
    p.ends()


def test_a_pipelined_pass_is_the_step_handed_over_before(pass_clock: PassClock) -> None:
    clock = pass_clock
    p = engine_passes(pipelined=True)
    steps = MIX * 3
    prev = 0
    for t in steps:  # (the first wait: for a pass of the step before the first, 0 tokens)
        pipelined_step(p, clock, t, prev)
        prev = t
    assert p.gaps_seen >= GAPS_KEPT
    # each gap kept with the tokens of the pass it measured: 12 ms and 2 us a token
    kept = sorted(zip(p.gaps_tokens, p.gaps, strict=True))
    assert all(g == gpu_ns(k) for k, g in kept)
    # the step now handed over is 256 tokens; the pass waited for is the last one's, 8,192...
    ended = clock.ns
    clock.ns = ended + 3 * MS
    p.begins(256)
    assert p.tokens == steps[-1] == 256  # (MIX ends with a decode)
    clock.ns = ended + gpu_ns(256)
    p.ends()
    # ... waiting for the 256 of the last step: planned by the shortest
    assert planned_wait(p, clock, 300, 256) == gpu_ns(256) - 3 * MS
    # waiting for the 300: none kept of 150-300 but the decodes' 256
    assert planned_wait(p, clock, 8192, 300) == gpu_ns(256) - 3 * MS
    # waiting for the 8,192: planned by the kept passes of 4,096-8,192
    assert planned_wait(p, clock, 256, 8192) == gpu_ns(4096) - 3 * MS
    assert p.tokens_misses == 0


def planned_wait(p: ForwardPasses, clock: PassClock, tokens: int, waited_tokens: int) -> int:
    """``pipelined_step``, planned: what the plan counted on being left of the
    pass waited for when the step was handed over (ns, before ``END_SHARE``)."""
    ended = clock.ns
    clock.ns = ended + 3 * MS
    p.begins(tokens)
    p.plan()
    left = round((p.deadline - clock.ns) / END_SHARE)
    assert p.planned_by_tokens == (left > gpu_ns(256) - 3 * MS + 1)
    clock.ns = ended + gpu_ns(waited_tokens)
    p.ends()
    return left


def test_the_plugin_says_how_many_plans_by_tokens_were_too_long(pass_clock: PassClock) -> None:
    """The handshake's and beats' reading counts them (the mirror shows them):
    0 from the start, then each pass over before its plan by tokens."""
    engine = FollowedEngine(num_blocks=256, defer_digest=True, windowed=True)
    f = engine.follower
    p = f.passes
    p.last_flush = math.inf  # (never idle)
    r = f.reading()
    assert r is not None and r.planned_too_long == 0 and r.overrun == 0  # said, as 0
    clock = pass_clock
    for t in MIX * 3:
        sync_step(p, clock, t)
    for n in (1, 2):
        deadline_after = planned(p, clock, 8192)
        assert p.planned_by_tokens
        clock.ns += deadline_after - MS  # over before its plan
        p.ends()
        r = f.reading()
        assert r is not None and r.planned_too_long == n == p.tokens_misses
        p.tokens_from = p.count  # (on again at once, for the second)
    assert r.overrun == f.reader.windows_overrun == 0
    engine.rt.check()
