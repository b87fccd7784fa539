"""The stream's compact events (docs/protocol.md): each hash as the pool's
events carry it, in hex -- 16 digits for the 64-bit int form (leading zeros
kept), the digest's bytes otherwise -- in the event's order."""

from __future__ import annotations

from app.stream import protocol as p
from app.stream.hub import compact_event
from blockpool import AllBlocksCleared, BlockRemoved, BlockStored


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
