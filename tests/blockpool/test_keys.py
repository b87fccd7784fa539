"""The 64-bit hash's hex forms: ``hex64_all`` (a list at once) names every
value as ``hex64`` does, one at a time -- the stream's events and the
dashboard name a block by them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blockpool.common.keys import PACK_FROM, hex64, hex64_all, key64, key_hex


@given(st.lists(st.integers(min_value=0, max_value=(1 << 64) - 1), max_size=600))
def test_a_list_of_64_bit_hashes_is_hexed_as_each_alone(values: list[int]) -> None:
    got = hex64_all(values)
    assert got == [hex64(v) for v in values]
    assert all(len(h) == 16 for h in got)


# a list hexed one by one (shorter than PACK_FROM) and one packed
LENGTHS = [1, PACK_FROM - 1, PACK_FROM, 3 * PACK_FROM]
EDGES = [0, 1, 0xAB, (1 << 64) - 1, 1 << 63]
EDGES_HEX = [
    "0000000000000000",
    "0000000000000001",
    "00000000000000ab",
    "ffffffffffffffff",
    "8000000000000000",
]


@pytest.mark.parametrize("n", LENGTHS)
def test_the_edges_of_64_bits_keep_their_leading_zeros(n: int) -> None:
    values = (EDGES * n)[:n]
    assert hex64_all(values) == (EDGES_HEX * n)[:n]
    assert hex64_all([]) == []


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("odd", [-1, 1 << 64, -(1 << 70)])
def test_a_value_outside_64_unsigned_bits_is_hexed_as_hex64_hexes_it(odd: int, n: int) -> None:
    # (an event from elsewhere may carry one: named as before, never refused)
    values = [5] * (n - 1) + [odd]
    assert hex64_all(values) == [hex64(v) for v in values]
    assert hex64_all(values)[-1] == hex64(odd)


@pytest.mark.parametrize("n", LENGTHS)
def test_a_list_not_all_ints_fails_as_hex64_fails(n: int) -> None:
    with pytest.raises(TypeError, match="format"):
        hex64(b"\x01")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="format"):
        hex64_all([1] * (n - 1) + [b"\x01"])  # type: ignore[list-item]


def test_a_map_key_is_named_by_its_digests_last_8_bytes() -> None:
    key = bytes(range(24)) + (7).to_bytes(4, "big")  # a digest, then its group id
    assert key64(key) == int.from_bytes(bytes(range(16, 24)), "big")
    assert key_hex(key) == "1011121314151617"
    assert key_hex(None) is None
