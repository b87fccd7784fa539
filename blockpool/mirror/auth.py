"""Only the engine is the engine: the mirror stream's shared secret.

The operator gives the engine's plugin and the mirror the same secret (a
token file: its first line, at least 16 characters).  Every message then
travels with an HMAC-SHA256 of its frames (``StreamKey.sign``): the mirror
drops a message whose mac does not verify before decoding a byte of it, the
plugin refuses an unsigned or wrong snapshot request, and a snapshot reply
is signed over the request's nonce (an old reply cannot be replayed).

Without a secret the frames carry an empty mac and anyone who can reach
the ports can read the stream and speak as the engine: loopback only, on a
machine whose local users are trusted (the README says so).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from pathlib import Path

MIN_SECRET = 16
MAC_BYTES = 32


class SecretError(ValueError):
    """A secret that cannot be used (missing, empty, too short)."""


class StreamKey:
    """An HMAC key over length-prefixed frames (see the module doc)."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET:
            raise SecretError(f"the mirror's secret needs at least {MIN_SECRET} characters")
        self._key = secret

    @classmethod
    def from_file(cls, path: str | Path) -> StreamKey:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretError(f"cannot read the mirror's secret from {path}: {exc}") from None
        line = text.splitlines()[0].strip() if text.strip() else ""
        if not line:
            raise SecretError(f"{path} holds no secret (its first line is empty)")
        return cls(line.encode())

    def sign(self, *parts: bytes) -> bytes:
        h = hmac.new(self._key, digestmod=hashlib.sha256)
        for p in parts:
            h.update(struct.pack("<Q", len(p)))
            h.update(p)
        return h.digest()

    def verify(self, mac: bytes, *parts: bytes) -> bool:
        return len(mac) == MAC_BYTES and hmac.compare_digest(mac, self.sign(*parts))

    def __repr__(self) -> str:  # never the secret itself
        return "StreamKey([redacted])"
