"""The stream's wire format: one binary envelope for every server frame.

    offset  size  field
    0       4     magic b"BPS1"
    4       1     kind: 1 config, 2 snapshot, 3 delta
    5       1     flags: bit 0 = what follows the envelope is zlib-compressed
    6       2     reserved (0)
    8       8     seq (u64, little-endian)
    16      4     header length H (u32)
    20      4     body length B (u32)
    24      H     header: UTF-8 JSON, space-padded so the body starts at a
                  multiple of 8
    24+H    B     body: columns, each starting at a multiple of 8, described
                  by header["columns"] = [[name, dtype, count, offset], ...]
                  (offset from the body's start)

dtypes: u8, i32, u32, u64, f64 (all little-endian).  A compressed frame
(flag bit 0) is the envelope followed by zlib(header + body); H and B give the
sizes after decompression.  See docs/protocol.md.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from blockpool.runtime.columns import BlockColumns

MAGIC = b"BPS1"
VERSION = 1
CONFIG, SNAPSHOT, DELTA = 1, 2, 3
KIND_NAMES = {CONFIG: "config", SNAPSHOT: "snapshot", DELTA: "delta"}
_HEAD = struct.Struct("<4sBB2xQII")
FLAG_ZLIB = 1
COMPRESS_MIN_BYTES = 256
DTYPES: dict[str, np.dtype[Any]] = {
    "u8": np.dtype("<u1"),
    "i32": np.dtype("<i4"),
    "u32": np.dtype("<u4"),
    "u64": np.dtype("<u8"),
    "f64": np.dtype("<f8"),
}
CHANNELS = ("blocks", "events", "series", "samples", "analysis")

# The block columns of snapshots and deltas, (name, wire dtype), in frame
# order: each is the BlockColumns attribute of that name.  The config frame
# sends this list as ``block_columns``; clients read the columns it names.
BLOCK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("state", "u8"),
    ("ref_cnt", "i32"),
    ("hashed", "u8"),
    ("hash64", "u64"),
    ("group", "u32"),
    ("stamp", "f64"),
)

# Event type codes in frames' compact event arrays.
EV_STORED, EV_REMOVED, EV_CLEARED = 0, 1, 2


def block_rows(
    cols: BlockColumns, ids: np.ndarray | None = None
) -> dict[str, tuple[str, np.ndarray]]:
    """The block columns for ``encode``: every block's rows, or those at ``ids``."""
    return {
        name: (dtype, getattr(cols, name) if ids is None else getattr(cols, name)[ids])
        for name, dtype in BLOCK_COLUMNS
    }


def encode(
    kind: int,
    seq: int,
    header: dict[str, Any],
    columns: dict[str, tuple[str, np.ndarray]] | None = None,
    compress: bool = False,
) -> bytes:
    """Build one frame.  ``columns`` maps name -> (dtype name, array)."""
    parts: list[bytes] = []
    spec: list[list[Any]] = []
    offset = 0
    for name, (dtype, arr) in (columns or {}).items():
        data = np.ascontiguousarray(arr, dtype=DTYPES[dtype]).tobytes()
        spec.append([name, dtype, len(arr), offset])
        pad = (-len(data)) % 8
        parts.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = dict(header)
    head["columns"] = spec
    raw = json.dumps(head, separators=(",", ":"), allow_nan=False).encode()
    raw += b" " * ((-(_HEAD.size + len(raw))) % 8)
    body = b"".join(parts)
    if compress and len(raw) + len(body) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(raw + body, 1)
        return _HEAD.pack(MAGIC, kind, FLAG_ZLIB, seq, len(raw), len(body)) + packed
    return _HEAD.pack(MAGIC, kind, 0, seq, len(raw), len(body)) + raw + body


def compress_frame(data: bytes) -> bytes:
    """The same frame, compressed (as the encoder would have made it)."""
    if data[5] & FLAG_ZLIB or len(data) - _HEAD.size < COMPRESS_MIN_BYTES:
        return data
    head = bytearray(data[: _HEAD.size])
    head[5] |= FLAG_ZLIB
    return bytes(head) + zlib.compress(data[_HEAD.size :], 1)


@dataclass
class Frame:
    kind: int
    seq: int
    header: dict[str, Any]
    columns: dict[str, np.ndarray]

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, str(self.kind))


class FrameError(ValueError):
    """A frame that does not follow the protocol."""


def decode(data: bytes) -> Frame:
    if len(data) < _HEAD.size:
        raise FrameError(f"frame of {len(data)} bytes is shorter than the envelope")
    magic, kind, flags, seq, hlen, blen = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    payload = data[_HEAD.size :]
    if flags & FLAG_ZLIB:
        try:
            payload = zlib.decompress(payload)
        except zlib.error as exc:
            raise FrameError(f"bad compressed payload: {exc}") from None
    if len(payload) != hlen + blen:
        raise FrameError("frame length does not match its envelope")
    header = json.loads(payload[:hlen])
    body = memoryview(payload)[hlen:]
    columns: dict[str, np.ndarray] = {}
    for name, dtype, count, offset in header.get("columns", []):
        dt = DTYPES[dtype]
        columns[name] = np.frombuffer(body, dtype=dt, count=count, offset=offset).copy()
    return Frame(kind, seq, header, columns)
