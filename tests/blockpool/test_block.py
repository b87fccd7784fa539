"""KVCacheBlock: fields, the set-once hash, reset, repr, equality."""

from __future__ import annotations

import pytest

from blockpool import (
    KVCacheBlock,
    PoolAssertionError,
    make_block_hash_with_group_id,
    sha256,
)

KEY_A = make_block_hash_with_group_id(sha256("a"), 0)
KEY_B = make_block_hash_with_group_id(sha256("b"), 3)


def test_defaults() -> None:
    b = KVCacheBlock(7)
    assert (b.block_id, b.ref_cnt, b.block_hash, b.is_null) == (7, 0, None, False)
    assert b._block_hash is None
    assert b.prev_free_block is None and b.next_free_block is None


def test_hash_lifecycle_unset_set_reset_set() -> None:
    b = KVCacheBlock(1)
    b.block_hash = KEY_A
    assert b.block_hash == KEY_A
    b.reset_hash()
    assert b.block_hash is None
    b.block_hash = KEY_B
    assert b.block_hash == KEY_B


def test_setting_a_hash_twice_is_an_assertion_and_keeps_the_first() -> None:
    b = KVCacheBlock(1)
    b.block_hash = KEY_A
    with pytest.raises(PoolAssertionError, match="already has a hash"):
        b.block_hash = KEY_B
    # vLLM code catching AssertionError still sees one.
    with pytest.raises(AssertionError):
        b.block_hash = KEY_A
    assert b.block_hash == KEY_A


def test_reset_hash_on_an_unhashed_block_is_a_no_op() -> None:
    b = KVCacheBlock(2, ref_cnt=3)
    b.reset_hash()
    assert (b.block_hash, b.ref_cnt) == (None, 3)


def test_repr_shows_neighbour_ids_not_neighbours() -> None:
    a, b, c = KVCacheBlock(1), KVCacheBlock(2, ref_cnt=0), KVCacheBlock(3)
    b.prev_free_block, b.next_free_block = a, c
    a.next_free_block = b
    c.prev_free_block = b
    assert repr(b) == (
        "KVCacheBlock(block_id=2, ref_cnt=0, _block_hash=None, "
        "prev_free_block=1, next_free_block=3)"
    )
    # No recursion into the neighbours' own repr (a cycle would never end).
    a.prev_free_block = c
    c.next_free_block = a
    assert "prev_free_block=3" in repr(a)
    hashed = KVCacheBlock(9, _block_hash=KEY_A)
    assert repr(hashed) == (
        f"KVCacheBlock(block_id=9, ref_cnt=0, _block_hash={KEY_A!r}, "
        "prev_free_block=None, next_free_block=None)"
    )


def test_equality_is_by_fields_and_blocks_are_unhashable() -> None:
    assert KVCacheBlock(1, ref_cnt=2) == KVCacheBlock(1, ref_cnt=2)
    assert KVCacheBlock(1) != KVCacheBlock(2)
    assert KVCacheBlock(1, _block_hash=KEY_A) != KVCacheBlock(1)
    assert KVCacheBlock(1, is_null=True) != KVCacheBlock(1)
    assert KVCacheBlock(1) != "block 1"
    with pytest.raises(TypeError):
        hash(KVCacheBlock(1))
