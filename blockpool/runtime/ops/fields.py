"""The bounds of the operations' fields: ids, counts, hashes, names.

The service's request bodies and OpenAPI schemas carry the same bounds
(app/pool/schemas.py derives them from the records).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from blockpool.common.keys import MAX_HASH_BYTES

MAX_INT = 2**31 - 1
BlockId = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
TokenId = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
GroupId = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
HexHash = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^(?:[0-9a-fA-F]{{2}}){{1,{MAX_HASH_BYTES}}}$",
        description="a block hash as hex (the raw digest, e.g. 64 hex digits for sha256)",
        examples=["9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"],
    ),
]
# a block hash raw, as an engine computed it (its records, never a REST body)
RawHash = Annotated[bytes, msgspec.Meta(min_length=1, max_length=MAX_HASH_BYTES)]
RequestId = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]
ExtraKey = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
