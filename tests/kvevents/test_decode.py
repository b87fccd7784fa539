"""The tolerant decoder: vLLM 0.16's positional form, map-tagged forms with
unknown fields, older/newer field counts, int or bytes hashes."""

from __future__ import annotations

import msgpack
import pytest

from blockpool import AllBlocksCleared, BlockRemoved, BlockStored
from blockpool.kvevents.decode import DecodeError, decode_batch
from blockpool.kvevents.hashes import hash_hex, norm_hash, parse_hash
from blockpool.kvevents.observed import ClearedEvent, RemovedEvent, StoredEvent
from tests.kvevents.helpers import Workload, map_tagged, positional

STORED = BlockStored(
    block_hashes=[11, 2**64 - 1],
    parent_block_hash=7,
    token_ids=[1, 2, 3, 4, 5, 6],
    block_size=3,
    lora_id=5,
    medium="GPU",
    lora_name="ad",
)
REMOVED = BlockRemoved(block_hashes=[11], medium="GPU")


def test_positional_vllm_016_batch() -> None:
    b = decode_batch(positional([STORED, REMOVED, AllBlocksCleared()], ts=2.5, rank=3))
    assert (b.ts, b.data_parallel_rank, b.encoding, b.unknown, b.malformed) == (
        2.5, 3, "positional", 0, 0,
    )  # fmt: skip
    assert b.events == [
        StoredEvent([11, 2**64 - 1], 7, [1, 2, 3, 4, 5, 6], 3, 5, "GPU", "ad"),
        RemovedEvent([11], "GPU"),
        ClearedEvent(),
    ]


def test_map_tagged_batch_with_unknown_fields() -> None:
    b = decode_batch(map_tagged([STORED, REMOVED, AllBlocksCleared()], ts=4.0, rank=1))
    assert (b.ts, b.data_parallel_rank, b.encoding) == (4.0, 1, "map")
    stored, removed, cleared = b.events
    assert isinstance(stored, StoredEvent)
    assert (stored.hashes, stored.parent, stored.block_size, stored.lora_name) == (
        [11, 2**64 - 1], 7, 3, "ad",
    )  # fmt: skip
    assert stored.extra == {"extra_keys": [["mm-hash", 3]]} and stored.group == 0
    assert removed == RemovedEvent([11], "GPU", None, 0)
    assert isinstance(cleared, ClearedEvent)
    assert b.unknown_fields is None  # extra_keys and group_idx are vLLM's own


def test_bytes_hashes_stay_bytes() -> None:
    b = decode_batch(map_tagged([STORED], as_bytes=True))
    ev = b.events[0]
    assert isinstance(ev, StoredEvent)
    assert ev.hashes == [(11).to_bytes(8, "big"), (2**64 - 1).to_bytes(8, "big")]
    assert ev.parent == (7).to_bytes(8, "big")


def test_older_and_newer_positional_shapes() -> None:
    old = msgpack.packb(  # vLLM 0.9: no medium, no lora_name, no rank
        [1.0, [["BlockStored", [1, 2], None, [9, 9, 9, 9], 2, None], ["BlockRemoved", [1]]]]
    )
    b = decode_batch(old)
    assert b.data_parallel_rank is None
    assert b.events == [StoredEvent([1, 2], None, [9, 9, 9, 9], 2), RemovedEvent([1])]
    new = msgpack.packb(  # a later release appending a field
        [1.0, [["BlockStored", [1], None, [9, 9], 2, None, "CPU", None, [["x", 1]]]], 0]
    )
    ev = decode_batch(new).events[0]
    assert isinstance(ev, StoredEvent)
    assert ev.medium == "CPU"
    assert ev.extra == {"positional": [[["x", 1]]]}


def test_signed_hashes_become_unsigned_64_bit() -> None:
    payload = msgpack.packb([0.0, [["BlockStored", [-1, -2], -3, [1, 1], 1, None, None, None]]])
    ev = decode_batch(payload).events[0]
    assert isinstance(ev, StoredEvent)
    assert ev.hashes == [2**64 - 1, 2**64 - 2]
    assert ev.parent == 2**64 - 3


def test_tags_are_matched_loosely_and_missing_block_size_is_inferred() -> None:
    payload = msgpack.packb(
        {"ts": 1, "dp_rank": 2, "events": [
            {"event_type": "block_stored", "hashes": [5, 6], "tokens": [1, 2, 3, 4]},
            {"type": b"BlockRemoved", "block_hashes": 5},
            {"kind": "all_blocks_cleared"},
        ]}
    )  # fmt: skip
    b = decode_batch(payload)
    assert b.data_parallel_rank == 2
    assert b.events == [
        StoredEvent([5, 6], None, [1, 2, 3, 4], 2),
        RemovedEvent([5]),
        ClearedEvent(),
    ]


def test_unknown_and_malformed_events_are_skipped_and_counted() -> None:
    payload = msgpack.packb(
        [1.0, [["BlockUpdated", [1]], ["BlockStored", "oops"], 42, [], {"no": "type"},
               ["BlockRemoved", [3], "GPU"]]]
    )  # fmt: skip
    b = decode_batch(payload)
    assert (b.unknown, b.malformed) == (1, 4)
    assert b.events == [RemovedEvent([3], "GPU")]


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgpack.packb(5), msgpack.packb([1.0]), msgpack.packb({"ts": 1}),
     msgpack.packb([1.0, "x"]), msgpack.packb(["x", []])],
)  # fmt: skip
def test_what_is_not_a_batch_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_real_workload_decodes_identically_in_both_encodings() -> None:
    w = Workload(seed=3)
    for evs in w.batches(60):
        a = decode_batch(positional(evs)).events
        b = decode_batch(map_tagged(evs)).events
        assert [type(x) for x in a] == [_kind(e) for e in evs]
        for x, y in zip(a, b, strict=True):
            assert type(x) is type(y)
            if isinstance(x, StoredEvent) and isinstance(y, StoredEvent):
                assert (x.hashes, x.parent, x.token_ids, x.lora_id, x.lora_name) == (
                    y.hashes, y.parent, y.token_ids, y.lora_id, y.lora_name,
                )  # fmt: skip
            elif isinstance(x, RemovedEvent) and isinstance(y, RemovedEvent):
                assert x.hashes == y.hashes
    blockpool_check(w)


def _kind(ev: object) -> type:
    return {
        "BlockStored": StoredEvent,
        "BlockRemoved": RemovedEvent,
        "AllBlocksCleared": ClearedEvent,
    }[type(ev).__name__]


def blockpool_check(w: Workload) -> None:
    import blockpool

    blockpool.check_invariants(w.pool)


def test_hash_text_forms() -> None:
    assert hash_hex(255) == "00000000000000ff"
    assert hash_hex(b"\x01\xab") == "01ab"
    assert parse_hash("00000000000000ff") == 255
    assert parse_hash("0xFF") == 255
    assert parse_hash("d:18446744073709551615") == 2**64 - 1
    assert parse_hash("01" * 16) == b"\x01" * 16
    for bad, why in (
        ("", "is not a hash"),
        ("xyz", "is not a hash"),
        ("0" * 17, "needs an even number of hex digits"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_hash(bad)
    assert norm_hash("ff") == 255
    assert norm_hash("0x" + "ab" * 16) == b"\xab" * 16
    with pytest.raises(TypeError):
        norm_hash(True)
    with pytest.raises(TypeError):
        norm_hash(1.5)


def test_poison_is_refused_or_trimmed_by_kind() -> None:
    import json
    import math

    from blockpool.kvevents.event_json import event_json

    with pytest.raises(DecodeError) as big:
        decode_batch(positional([STORED]), max_bytes=16)
    assert big.value.kind == "too_large"
    deep = b"\x92" + msgpack.packb(1.0) + b"\x91" * 5000 + b"\x90"
    with pytest.raises(DecodeError) as nested:
        decode_batch(deep)
    assert nested.value.kind == "too_deep"
    with pytest.raises(DecodeError) as junk:
        decode_batch(b"\xc1")
    assert junk.value.kind == "not_msgpack"
    # numbers: a token id is a finite integer; ts finite (else 0.0, counted)
    for bad in (math.inf, -math.inf, math.nan, 1.5):
        payload = msgpack.packb([math.nan, [["BlockStored", [1], None, [bad], 1]], 0])
        b = decode_batch(payload)
        assert (b.events, b.malformed, b.ts) == ([], 1, 0.0)
        assert b.issues == {"bad_number": 1, "non_finite_ts": 1}
    ok = decode_batch(msgpack.packb([2.0, [["BlockStored", [1], None, [3.0], 1]]]))
    assert ok.issues is None and ok.events[0].token_ids == [3]  # type: ignore[union-attr]
    # unknown fields are kept JSON-safe and bounded
    nested_extra: object = 1
    for _ in range(600):
        nested_extra = [nested_extra]
    ev = {"type": "BlockRemoved", "block_hashes": [3], "deep": nested_extra,
          "nan": math.nan, "wide": list(range(10_000)), "long": "x" * 100_000}  # fmt: skip
    b = decode_batch(msgpack.packb({"ts": 1.0, "events": [ev]}))
    removed = b.events[0]
    assert isinstance(removed, RemovedEvent) and removed.extra is not None
    assert removed.extra["nan"] == "nan" and len(removed.extra["wide"]) == 256
    assert len(removed.extra["long"]) == 4096
    assert b.issues == {"extra_cut": 4}
    text = json.dumps(event_json(1, b.ts, (0, removed)), allow_nan=False)
    assert "nested too deep" in text


def test_current_vllm_groups_and_unknown_fields() -> None:
    """vLLM >= 0.24: an array batch of map events tagged by "type", with the
    KV-cache group and its spec; fields no release sends are kept, counted."""
    from tests.kvevents.helpers import vllm_current

    payload = vllm_current(
        [STORED, REMOVED], group=1, kind="sliding_window", window=128,
        unknown={"future_field": [1, 2]},
    )  # fmt: skip
    b = decode_batch(payload)
    stored, removed = b.events
    assert isinstance(stored, StoredEvent) and isinstance(removed, RemovedEvent)
    assert (stored.group, stored.spec_kind, stored.sliding_window) == (1, "sliding_window", 128)
    assert removed.group == 1 and removed.hashes == [11]
    assert stored.extra == {"extra_keys": [None, None], "future_field": [1, 2]}
    assert b.unknown_fields == {"future_field": 2} and b.encoding == "map"
    bad = msgpack.packb(
        [1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": None, "group_idx": 9999}]]
    )
    assert decode_batch(bad).issues == {"bad_number": 1}
