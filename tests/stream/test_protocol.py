"""The frame envelope: round trips, alignment, and refusal of bad frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.stream import protocol as p


def test_round_trip_keeps_header_and_typed_columns() -> None:
    cols = {
        "ids": ("u32", np.array([3, 1, 2], dtype=np.uint32)),
        "state": ("u8", np.array([1, 2, 3], dtype=np.uint8)),
        "ref_cnt": ("i32", np.array([-1, 0, 7], dtype=np.int32)),
        "hash64": ("u64", np.array([2**64 - 1, 0, 12345], dtype=np.uint64)),
        "stamp": ("f64", np.array([1.5, 2**52, 0.0])),
    }
    data = p.encode(p.DELTA, 42, {"tick": 7, "events": [[1, 1, ["00ff"]]]}, cols)
    frame = p.decode(data)
    assert (frame.kind, frame.seq, frame.kind_name) == (p.DELTA, 42, "delta")
    assert frame.header["tick"] == 7 and frame.header["events"] == [[1, 1, ["00ff"]]]
    for name, (_, arr) in cols.items():
        assert frame.columns[name].tolist() == arr.tolist()
        assert frame.columns[name].dtype == p.DTYPES[cols[name][0]]


def test_body_and_every_column_start_at_a_multiple_of_8() -> None:
    cols = {"a": ("u8", np.arange(5, dtype=np.uint8)), "b": ("f64", np.arange(3.0))}
    data = p.encode(p.SNAPSHOT, 1, {"x": "y" * 13}, cols)
    hlen = int.from_bytes(data[16:20], "little")
    body = 24 + hlen
    assert body % 8 == 0
    header = json.loads(data[24:body])
    assert [c[3] % 8 for c in header["columns"]] == [0, 0]
    assert header["columns"] == [["a", "u8", 5, 0], ["b", "f64", 3, 8]]
    assert data[:4] == b"BPS1" and data[4] == p.SNAPSHOT


def test_header_only_frame() -> None:
    frame = p.decode(p.encode(p.CONFIG, 0, {"protocol": 1}))
    assert frame.kind == p.CONFIG and frame.columns == {} and frame.header["protocol"] == 1


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: b"XXXX" + d[4:], "bad magic"),
        (lambda d: d[:-1], "does not match"),
        (lambda d: d[:10], "shorter than the envelope"),
    ],
)
def test_bad_frames_are_refused(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = p.encode(p.DELTA, 1, {}, {"ids": ("u32", np.array([1], dtype=np.uint32))})
    with pytest.raises(p.FrameError, match=message):
        p.decode(mutate(data))


def test_nan_is_not_sent() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        p.encode(p.DELTA, 1, {"x": float("nan")})
