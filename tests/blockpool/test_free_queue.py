"""FreeKVCacheBlockQueue: the intrusive doubly linked list of free blocks."""

from __future__ import annotations

import random

import pytest

from blockpool import FreeKVCacheBlockQueue, KVCacheBlock, PoolAssertionError


def make(n: int) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def ids(q: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in q.get_all_free_blocks()]


def _walk(start: KVCacheBlock, end: KVCacheBlock, link: str) -> list[KVCacheBlock]:
    """The blocks from ``start`` to ``end`` (both left out) along ``link``."""
    out = []
    cur = getattr(start, link)
    while cur is not end:
        assert cur is not None, f"the {link} chain breaks before its end"
        out.append(cur)
        cur = getattr(cur, link)
    return out


def check_links(q: FreeKVCacheBlockQueue) -> None:
    """Forward and backward walks agree and match num_free_blocks."""
    fwd = _walk(q.fake_free_list_head, q.fake_free_list_tail, "next_free_block")
    back = _walk(q.fake_free_list_tail, q.fake_free_list_head, "prev_free_block")
    assert fwd == back[::-1]
    assert [id(b) for b in fwd] == [id(b) for b in reversed(back)]
    assert len(fwd) == q.num_free_blocks
    assert q.fake_free_list_head.prev_free_block is None
    assert q.fake_free_list_tail.next_free_block is None


def unlinked(b: KVCacheBlock) -> bool:
    return b.prev_free_block is None and b.next_free_block is None


def test_starts_in_the_given_order_with_sentinels() -> None:
    blocks = [KVCacheBlock(i) for i in (4, 2, 9)]
    q = FreeKVCacheBlockQueue(blocks)
    assert ids(q) == [4, 2, 9]
    assert q.num_free_blocks == 3
    assert q.fake_free_list_head.block_id == -1 and q.fake_free_list_tail.block_id == -1
    assert q.fake_free_list_head.next_free_block is blocks[0]
    assert blocks[0].prev_free_block is q.fake_free_list_head
    assert q.fake_free_list_tail.prev_free_block is blocks[-1]
    assert blocks[-1].next_free_block is q.fake_free_list_tail
    check_links(q)


def test_empty_queue_links_the_sentinels() -> None:
    q = FreeKVCacheBlockQueue([])
    assert q.num_free_blocks == 0
    assert q.fake_free_list_head.next_free_block is q.fake_free_list_tail
    assert q.fake_free_list_tail.prev_free_block is q.fake_free_list_head
    assert q.get_all_free_blocks() == []
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    assert q.popleft_n(0) == []
    check_links(q)


def test_popleft_takes_the_head_and_clears_its_links() -> None:
    blocks, q = make(3)
    first = q.popleft()
    assert first is blocks[0] and unlinked(first)
    assert ids(q) == [1, 2]
    assert q.fake_free_list_head.next_free_block is blocks[1]
    assert blocks[1].prev_free_block is q.fake_free_list_head
    assert [q.popleft().block_id, q.popleft().block_id] == [1, 2]
    assert q.num_free_blocks == 0
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    assert q.num_free_blocks == 0
    check_links(q)


def test_popleft_n_in_order() -> None:
    _, q = make(6)
    got = q.popleft_n(4)
    assert [b.block_id for b in got] == [0, 1, 2, 3]
    assert all(unlinked(b) for b in got)
    assert ids(q) == [4, 5] and q.num_free_blocks == 2
    assert q.popleft_n(0) == [] and ids(q) == [4, 5]
    assert [b.block_id for b in q.popleft_n(2)] == [4, 5]
    assert q.fake_free_list_head.next_free_block is q.fake_free_list_tail
    assert q.fake_free_list_tail.prev_free_block is q.fake_free_list_head
    check_links(q)


def test_popleft_n_more_than_free_is_an_assertion_and_changes_nothing() -> None:
    _, q = make(3)
    with pytest.raises(PoolAssertionError):
        q.popleft_n(4)
    assert ids(q) == [0, 1, 2] and q.num_free_blocks == 3
    check_links(q)


@pytest.mark.parametrize("which", [0, 2, 4])
def test_remove_from_head_middle_tail(which: int) -> None:
    blocks, q = make(5)
    q.remove(blocks[which])
    assert unlinked(blocks[which])
    assert ids(q) == [i for i in range(5) if i != which]
    check_links(q)


def test_remove_an_unlinked_block_is_a_runtime_error() -> None:
    blocks, q = make(3)
    q.remove(blocks[1])
    with pytest.raises(RuntimeError, match="remove\\(\\) called on an invalid block"):
        q.remove(blocks[1])
    with pytest.raises(RuntimeError):
        q.remove(KVCacheBlock(99))
    assert ids(q) == [0, 2] and q.num_free_blocks == 2
    check_links(q)


def test_append_and_append_n_keep_the_given_order_at_the_tail() -> None:
    blocks, q = make(6)
    taken = q.popleft_n(6)
    q.append(taken[3])
    assert ids(q) == [3]
    q.append_n([taken[5], taken[0], taken[2]])
    assert ids(q) == [3, 5, 0, 2]
    q.append_n([])
    assert ids(q) == [3, 5, 0, 2] and q.num_free_blocks == 4
    q.append(taken[1])
    assert ids(q) == [3, 5, 0, 2, 1]
    assert q.fake_free_list_tail.prev_free_block is blocks[1]
    check_links(q)


def test_remove_then_append_moves_a_block_to_the_tail() -> None:
    blocks, q = make(4)
    q.remove(blocks[1])
    q.append(blocks[1])
    assert ids(q) == [0, 2, 3, 1]
    q.remove(blocks[0])
    q.remove(blocks[3])
    q.append_n([blocks[3], blocks[0]])
    assert ids(q) == [2, 1, 3, 0]
    assert [q.popleft().block_id for _ in range(4)] == [2, 1, 3, 0]
    check_links(q)


def test_iteration_matches_get_all_free_blocks() -> None:
    blocks, q = make(5)
    q.remove(blocks[2])
    assert list(q) == q.get_all_free_blocks() == [blocks[i] for i in (0, 1, 3, 4)]


def test_a_long_mixed_sequence_against_a_list_model() -> None:
    rng = random.Random(7)
    blocks, q = make(50)
    model = list(range(50))
    out: list[int] = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.3 and model:
            n = rng.randint(0, min(4, len(model)))
            got = [b.block_id for b in q.popleft_n(n)]
            assert got == model[:n]
            del model[:n]
            out += got
        elif op < 0.5 and model:
            bid = rng.choice(model)
            q.remove(blocks[bid])
            model.remove(bid)
            out.append(bid)
        elif op < 0.6 and model:
            bid = q.popleft().block_id
            assert bid == model.pop(0)
            out.append(bid)
        elif out:
            k = rng.randint(1, min(5, len(out)))
            chosen = rng.sample(out, k)
            for bid in chosen:
                out.remove(bid)
            if k == 1 and rng.random() < 0.5:
                q.append(blocks[chosen[0]])
            else:
                q.append_n([blocks[b] for b in chosen])
            model += chosen
        assert q.num_free_blocks == len(model)
    assert ids(q) == model
    check_links(q)


def test_popleft_on_a_count_out_of_step_with_the_links_is_an_assertion() -> None:
    # As vLLM's: an empty list with a non-zero count is a broken queue.
    _, q = make(2)
    q.fake_free_list_head.next_free_block = q.fake_free_list_tail
    with pytest.raises(AssertionError, match="out of sync"):
        q.popleft()
    assert q.num_free_blocks == 2  # nothing changed
    q.fake_free_list_head.next_free_block = None  # a head with no link at all
    with pytest.raises(AssertionError, match="out of sync"):
        q.popleft()
