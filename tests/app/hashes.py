"""Block hashes as the engine must compute them, written out for the tests
(not the service's own helpers)."""

from __future__ import annotations

from typing import Any

from blockpool import hash_block_tokens
from tests.app.conftest import Api


def chain(api: Api, tokens: list[int], parent: bytes | None = None, extra: Any = None) -> list[str]:
    """Chained block hashes as the engine must compute them (block_size 4)."""
    out = []
    fn = api.engine.hash_fn
    for i in range(0, len(tokens), 4):
        keys = extra(i) if callable(extra) else extra
        parent = hash_block_tokens(fn, parent, tokens[i : i + 4], keys)
        out.append(parent.hex())
    return out


def h64(hex_digest: str) -> str:
    """The 64-bit form events and views show: the digest's last 8 bytes."""
    return hex_digest[-16:]
