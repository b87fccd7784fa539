"""The stream's compact events (docs/protocol.md): each hash as the pool's
events carry it, in hex -- 16 digits for the 64-bit int form (leading zeros
kept), the digest's bytes otherwise -- in the event's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.stream import protocol as p
from app.stream.hub import compact_event, compact_events
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


def stored(hashes: list[int] | list[bytes], parent: int | bytes | None) -> BlockStored:
    return BlockStored(
        block_hashes=hashes,  # type: ignore[arg-type]
        parent_block_hash=parent,
        token_ids=list(range(16 * len(hashes))),
        block_size=16,
        lora_id=None,
        medium=None,
        lora_name=None,
    )


def test_a_prefills_stored_int_hashes_are_16_hex_digits_each_in_order() -> None:
    hashes = [(i * 0x9E3779B97F4A7C15) % (1 << 64) for i in range(300)] + [0, (1 << 64) - 1]
    got = compact_event(9, stored(hashes, 0xAB))
    assert got[:2] == [9, p.EV_STORED]
    assert got[2] == [format(h, "016x") for h in hashes]
    assert got[2][-2:] == ["0000000000000000", "ffffffffffffffff"]
    assert got[3:] == ["00000000000000ab", 4832, 16, None]


def test_removed_bytes_hashes_are_their_digests_hex() -> None:
    hashes = [bytes([i]) * 32 for i in (1, 2, 255)]
    assert compact_event(3, BlockRemoved(block_hashes=hashes, medium=None)) == [  # type: ignore[arg-type]
        3,
        p.EV_REMOVED,
        [h.hex() for h in hashes],
    ]


def test_an_int_hash_beyond_64_bits_is_named_not_refused() -> None:
    # (an engine's events from elsewhere: the same text as before hex64_all)
    got = compact_event(1, BlockRemoved(block_hashes=[1 << 64, 5], medium=None))
    assert got[2] == [format(1 << 64, "016x"), "0000000000000005"]


def test_a_clear_has_no_hashes() -> None:
    assert compact_event(4, AllBlocksCleared()) == [4, p.EV_CLEARED]


INT_HASH = st.one_of(
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),  # named, never refused
)
BYTES_HASH = st.binary(min_size=1, max_size=40)


@st.composite
def events(draw: st.DrawFn) -> KVCacheEvent:
    """An event of the pool's: its hashes all ints or all bytes."""
    kind = draw(st.sampled_from(["removed", "stored", "cleared"]))
    if kind == "cleared":
        return AllBlocksCleared()
    n = draw(st.sampled_from([1, 1, 1, 2, 9]))  # mostly one hash: an eviction, a decode block
    hashes: list[int] | list[bytes]
    parent: int | bytes | None
    if draw(st.booleans()):
        hashes = draw(st.lists(INT_HASH, min_size=n, max_size=n))
        parent = draw(st.one_of(st.none(), INT_HASH))
    else:
        hashes = draw(st.lists(BYTES_HASH, min_size=n, max_size=n))
        parent = draw(st.one_of(st.none(), BYTES_HASH))
    if kind == "removed":
        return BlockRemoved(block_hashes=hashes, medium=None)  # type: ignore[arg-type]
    ev = stored(hashes, parent)
    ev.lora_name = draw(st.one_of(st.none(), st.just("adapter")))
    return ev


@given(st.lists(events(), max_size=40))
def test_a_ticks_events_are_each_events_compact_form_in_order(evs: list[KVCacheEvent]) -> None:
    items = [(100 + i, 0.5, ev) for i, ev in enumerate(evs)]
    assert compact_events(items) == [compact_event(seq, ev) for seq, _, ev in items]


def test_an_evictions_one_int_hash_keeps_its_leading_zeros() -> None:
    items = [
        (1, 0.0, BlockRemoved(block_hashes=[0xAB], medium=None)),
        (2, 0.0, stored([(1 << 64) - 1], None)),
        (3, 0.0, stored([5], 0xC)),
    ]
    assert compact_events(items) == [
        [1, p.EV_REMOVED, ["00000000000000ab"]],
        [2, p.EV_STORED, ["ffffffffffffffff"], None, 16, 16, None],
        [3, p.EV_STORED, ["0000000000000005"], "000000000000000c", 16, 16, None],
    ]
