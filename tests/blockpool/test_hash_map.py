"""BlockHashToBlockMap: one block per key, promoted to a dict on a duplicate."""

from __future__ import annotations

from blockpool import BlockHashToBlockMap, KVCacheBlock, make_block_hash_with_group_id, sha256

K1 = make_block_hash_with_group_id(sha256("one"), 0)
K2 = make_block_hash_with_group_id(sha256("two"), 0)
K1_G1 = make_block_hash_with_group_id(sha256("one"), 1)


def blocks(*ids: int) -> list[KVCacheBlock]:
    return [KVCacheBlock(i) for i in ids]


def test_absent_key() -> None:
    m = BlockHashToBlockMap()
    assert m.get_one_block(K1) is None
    assert m.pop(K1, 3) is None
    assert len(m) == 0 and m._cache == {}


def test_single_block_is_stored_directly() -> None:
    m = BlockHashToBlockMap()
    (b,) = blocks(5)
    m.insert(K1, b)
    assert m._cache[K1] is b  # no dict for the common case
    assert m.get_one_block(K1) is b
    assert len(m) == 1 and K1 in m and K2 not in m


def test_group_ids_make_distinct_keys() -> None:
    m = BlockHashToBlockMap()
    a, b = blocks(1, 2)
    m.insert(K1, a)
    m.insert(K1_G1, b)
    assert m.get_one_block(K1) is a and m.get_one_block(K1_G1) is b
    assert len(m) == 2


def test_duplicates_promote_to_a_dict_and_first_inserted_is_returned() -> None:
    m = BlockHashToBlockMap()
    a, b, c = blocks(7, 3, 5)
    m.insert(K1, a)
    m.insert(K1, b)
    entry = m._cache[K1]
    assert isinstance(entry, dict) and entry == {7: a, 3: b}
    assert list(entry) == [7, 3]
    m.insert(K1, c)
    assert list(m._cache[K1]) == [7, 3, 5]
    assert m.get_one_block(K1) is a  # first inserted, not lowest id
    assert len(m) == 1  # keys, not blocks
    assert m.blocks_under(K1) == [a, b, c]


def test_pop_single_returns_it_and_drops_the_key() -> None:
    m = BlockHashToBlockMap()
    (a,) = blocks(4)
    m.insert(K1, a)
    assert m.pop(K1, 4) is a
    assert K1 not in m and len(m) == 0


def test_pop_of_another_id_leaves_a_single_block_in_place() -> None:
    m = BlockHashToBlockMap()
    (a,) = blocks(4)
    m.insert(K1, a)
    assert m.pop(K1, 9) is None
    assert m._cache[K1] is a and len(m) == 1


def test_pop_from_a_dict_keeps_the_dict_even_with_one_left() -> None:
    m = BlockHashToBlockMap()
    a, b, c = blocks(1, 2, 3)
    for blk in (a, b, c):
        m.insert(K1, blk)
    assert m.pop(K1, 1) is a
    assert m.get_one_block(K1) is b  # the next first-inserted
    assert m.pop(K1, 9) is None  # absent id: dict unchanged
    assert list(m._cache[K1]) == [2, 3]
    assert m.pop(K1, 3) is c
    assert m._cache[K1] == {2: b}  # still a dict, not demoted
    assert m.get_one_block(K1) is b
    assert m.pop(K1, 2) is b
    assert K1 not in m and len(m) == 0  # the empty dict goes with the key


def test_insert_into_a_demoted_dict_keeps_order() -> None:
    m = BlockHashToBlockMap()
    a, b, c = blocks(1, 2, 3)
    m.insert(K1, a)
    m.insert(K1, b)
    m.pop(K1, 1)
    m.insert(K1, c)
    assert list(m._cache[K1]) == [2, 3]
    m.insert(K1, a)  # re-inserted blocks go last
    assert list(m._cache[K1]) == [2, 3, 1]
    assert m.get_one_block(K1) is b


def test_pop_reinserts_the_key_at_the_end() -> None:
    # vLLM pops the key and puts it back when blocks remain, so the key
    # moves to the end of the dict's iteration order.
    m = BlockHashToBlockMap()
    a, b, c = blocks(1, 2, 3)
    m.insert(K1, a)
    m.insert(K1, b)
    m.insert(K2, c)
    assert list(m._cache) == [K1, K2]
    m.pop(K1, 1)
    assert list(m._cache) == [K2, K1]
    m.pop(K2, 99)  # a miss on a single block also puts it back last
    assert list(m._cache) == [K1, K2]
    assert [(k, [x.block_id for x in bl]) for k, bl in m.iter_entries()] == [
        (K1, [2]),
        (K2, [3]),
    ]
