"""KV events: the structs, their wire form, and what the pool emits."""

from __future__ import annotations

import msgspec
import pytest

from blockpool import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockPool,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    LoRARequest,
    Request,
    check_invariants,
    decode_event_batch,
    encode_event_batch,
    get_request_block_hasher,
    set_int_block_hashes,
    sha256,
)

BS = 4


def stored(**over: object) -> BlockStored:
    fields: dict[str, object] = {
        "block_hashes": [11, 2**64 - 1],
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": MEDIUM_GPU,
        "lora_name": None,
    }
    fields.update(over)
    return BlockStored(**fields)  # type: ignore[arg-type]


def as_int(h: bytes) -> int:
    return int.from_bytes(h[-8:], "big")


def test_field_order_matches_vllm() -> None:
    assert BlockStored.__struct_fields__ == (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    )
    assert BlockRemoved.__struct_fields__ == ("block_hashes", "medium")
    assert AllBlocksCleared.__struct_fields__ == ()
    assert KVEventBatch.__struct_fields__ == ("ts", "events", "data_parallel_rank")


def test_events_are_hashable_and_compare_by_value() -> None:
    a, b = stored(), stored()
    assert a == b and hash(a) == hash(b)
    assert stored(parent_block_hash=5) != a
    assert BlockRemoved([1], "GPU") == BlockRemoved([1], "GPU")
    assert hash(BlockRemoved([1], "GPU")) == hash(BlockRemoved([1], "GPU"))
    assert BlockRemoved([1], "GPU") != BlockRemoved([2], "GPU")
    assert AllBlocksCleared() == AllBlocksCleared()


def test_wire_form_is_a_positional_array_tagged_with_the_type_name() -> None:
    batch = KVEventBatch(
        ts=1.5,
        events=[
            stored(parent_block_hash=7, lora_id=3, lora_name="sql"),
            BlockRemoved([11], MEDIUM_GPU),
            AllBlocksCleared(),
        ],
        data_parallel_rank=2,
    )
    raw = msgspec.msgpack.decode(encode_event_batch(batch))
    assert raw == [
        1.5,
        [
            ["BlockStored", [11, 2**64 - 1], 7, list(range(8)), 4, 3, "GPU", "sql"],
            ["BlockRemoved", [11], "GPU"],
            ["AllBlocksCleared"],
        ],
        2,
    ]


def test_a_batch_without_rank_sends_nil() -> None:
    # Positional arrays keep every field (vLLM 0.16 sends the same bytes).
    batch = KVEventBatch(ts=0.25, events=[BlockRemoved([1], MEDIUM_GPU)])
    payload = encode_event_batch(batch)
    assert msgspec.msgpack.decode(payload) == [0.25, [["BlockRemoved", [1], "GPU"]], None]
    assert payload == b"\x93\xcb" + msgspec.msgpack.encode(0.25)[1:] + (
        b"\x91\x93\xacBlockRemoved\x91\x01\xa3GPU\xc0"
    )
    assert decode_event_batch(encode_event_batch(batch)) == batch


def test_round_trip_with_int_and_bytes_hashes() -> None:
    events = [
        stored(),
        stored(block_hashes=[b"\x00" * 32], parent_block_hash=b"\x01" * 32),
        BlockRemoved([2**64 - 1, 0], MEDIUM_GPU),
        BlockRemoved([b"\xff" * 32], None),
        AllBlocksCleared(),
    ]
    batch = KVEventBatch(ts=123.456, events=events, data_parallel_rank=0)
    back = decode_event_batch(encode_event_batch(batch))
    assert back == batch
    assert [type(e) for e in back.events] == [type(e) for e in events]
    assert back.events[1].block_hashes == [b"\x00" * 32]  # type: ignore[union-attr]


def test_decoding_rejects_an_unknown_event_type() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockMoved", [1]]]])
    with pytest.raises(msgspec.ValidationError):
        decode_event_batch(payload)


def request(tokens: list[int], lora: LoRARequest | None = None) -> Request:
    return Request(
        "r", tokens, block_hasher=get_request_block_hasher(BS, sha256), lora_request=lora
    )


def test_pool_events_in_order_with_every_field() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=BS, enable_kv_cache_events=True)
    lora = LoRARequest("sql-adapter", 7)
    req = request(list(range(100, 114)), lora)  # 3 full blocks + 2 tokens
    h = req.block_hashes
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    pool.cache_full_blocks(req, blocks, 1, 3, BS, 0)
    pool.cache_full_blocks(req, blocks, 3, 3, BS, 0)  # nothing new: no event
    pool.free_blocks(reversed(blocks))  # queue: 5 6 7 4 3 2 1
    pool.get_new_blocks(5)  # 5, 6, 7 (unhashed), 4 (unhashed), 3 (evicted)
    assert pool.take_events() == [
        BlockStored([as_int(h[0])], None, list(range(100, 104)), BS, 7, "GPU", "sql-adapter"),
        BlockStored(
            [as_int(h[1]), as_int(h[2])],
            as_int(h[0]),
            list(range(104, 112)),
            BS,
            7,
            "GPU",
            "sql-adapter",
        ),
        BlockRemoved([as_int(h[2])], "GPU"),
    ]
    assert pool.take_events() == []  # each event exactly once
    check_invariants(pool)


@pytest.mark.usefixtures("restore_hash_settings")
def test_pool_events_with_raw_bytes_hashes() -> None:
    set_int_block_hashes(False)
    pool = BlockPool(4, enable_caching=True, hash_block_size=BS, enable_kv_cache_events=True)
    req = request(list(range(8)))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    pool.cache_full_blocks(req, blocks, 1, 2, BS, 0)
    pool.evict_blocks([2])
    h = req.block_hashes
    assert pool.take_events() == [
        BlockStored([h[0]], None, [0, 1, 2, 3], BS, None, "GPU", None),
        BlockStored([h[1]], h[0], [4, 5, 6, 7], BS, None, "GPU", None),
        BlockRemoved([h[1]], "GPU"),
    ]
    # Raw hashes survive the wire as msgpack bin.
    batch = KVEventBatch(ts=1.0, events=pool.kv_event_queue)
    assert decode_event_batch(encode_event_batch(batch)) == batch
    pool.free_blocks(blocks)
    check_invariants(pool)
