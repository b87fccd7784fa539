"""The hashes of observed KV events: normalised as the observer keys them
(an unsigned 64-bit int, or the digest's bytes), written and read as text."""

from __future__ import annotations

from typing import Any

MASK64 = (1 << 64) - 1
Hash = int | bytes


def norm_hash(value: Any) -> Hash:
    """An event hash as the observer keys it: unsigned 64-bit int or bytes."""
    if isinstance(value, bool):
        raise TypeError("a hash cannot be a bool")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0x")
        if text and all(c in "0123456789abcdef" for c in text):
            if len(text) <= 16:
                return int(text, 16)
            return bytes.fromhex(text if len(text) % 2 == 0 else "0" + text)
        raise ValueError(f"a text hash must be hex, not {value[:40]!r}")
    raise TypeError(f"a hash cannot be a {type(value).__name__}")


def hash_hex(h: Hash) -> str:
    """A hash as the pages show it: 16 hex digits for the 64-bit int form."""
    return f"{h:016x}" if isinstance(h, int) else h.hex()


def parse_hash(text: str) -> Hash:
    """The inverse of ``hash_hex``: 16 or fewer hex digits are the int form;
    a decimal number prefixed ``d:`` too; longer hex is a digest."""
    t = text.strip().lower()
    if t.startswith("d:"):
        return int(t[2:]) & MASK64
    t = t.removeprefix("0x")
    if not t or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"{text!r} is not a hash (hex digits, or d:<decimal>)")
    if len(t) <= 16:
        return int(t, 16)
    if len(t) % 2:
        raise ValueError(f"{text!r}: a digest needs an even number of hex digits")
    return bytes.fromhex(t)
