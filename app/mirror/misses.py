"""Why the engine's requests missed: the miss reasons of a mirrored engine.

The plugin sends each request's block hashes and prompt length at arrival,
and its prefix hit when first scheduled -- no token ids.  When a request's
first scheduling arrives, before the operations of that step are applied,
its prompt blocks are classified against the mirrored pool as the step
found it (the same names as the simulated pool's reasons,
blockpool/analysis/misses.py):

``last_token``
    Cached, every earlier block hit, but it holds the last prompt token.
``block_size_floor``
    The partial tail block (never hashed).
``evicted`` / ``reset``
    Its hash was cached in the mirrored pool and an allocation (or the
    evict operation) took it since -- or a prefix-cache reset dropped it; the
    detail says when, which block held it and why.  A hash cached when the
    step began but missed anyway was evicted in that step (``in_step``).
``chain_broken``
    Still cached, but an earlier block missed.
``cold``
    Never cached while the mirror watched (within the bounded memory of
    dropped hashes); every later block then is cold too.

Not told by hashes alone: ``extra_keys`` and the shared-token floor (both
need the prompt's tokens, which never leave the engine).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from blockpool.common.miss_reasons import (
    CHAIN_BROKEN,
    COLD,
    EVICTED,
    FLOOR,
    LAST_TOKEN,
    NUM_CODES,
    REASONS,
    RESET_DROP,
)
from blockpool.common.reasons import CAUSES

GID0 = b"\0\0\0\0"


class EngineMisses:
    """The dropped hashes the classification looks up, and the tally."""

    def __init__(self, block_size: int, remembered: int = 65_536) -> None:
        self.bs = block_size
        self.remembered = remembered
        # group-0 key -> (cause index, when, the block that held it)
        self.gone: OrderedDict[bytes, tuple[int, float, int]] = OrderedDict()
        self.blocks = [0] * NUM_CODES  # per code (0 = hit)
        self.tokens = [0] * NUM_CODES
        self.admissions = 0

    # ---------------------------------------------------- the applier's hook

    def dropped(self, pool: Any, ids: list[int] | None, cause: int, now: float) -> None:
        """Before an operation takes the hashes of blocks ``ids`` (None: every
        block, a reset) out of the mirrored pool."""
        blocks = pool.blocks
        gone = self.gone
        n = len(blocks)
        for b in blocks if ids is None else (blocks[i] for i in ids if i < n):
            key = b.block_hash
            if key is None or bytes(key[-4:]) != GID0:
                continue
            key = bytes(key)
            gone.pop(key, None)
            gone[key] = (cause, now, b.block_id)
        while len(gone) > self.remembered:
            gone.popitem(last=False)

    # -------------------------------------------------------- classification

    def classify(
        self, pool: Any, hashes: list[bytes], prompt: int, hit_tokens: int, now: float
    ) -> tuple[list[str | None], dict[int, dict[str, Any]]]:
        """(reason or None for a hit, per prompt block; details by block)."""
        bs = self.bs
        cached = pool.cached_block_hash_to_block.get_one_block
        full = min(prompt // bs, len(hashes))
        total = -(-prompt // bs)
        num_hit = min(hit_tokens // bs, full)
        codes = [0] * total
        details: dict[int, dict[str, Any]] = {}
        max_hit = (prompt - 1) // bs
        i = num_hit
        if i < full:
            key = hashes[i] + GID0
            if cached(key) is not None:
                codes[i] = LAST_TOKEN if i == max_hit else EVICTED
                if codes[i] == EVICTED:
                    details[i] = {"in_step": True}
            else:
                codes[i] = self._history(key, now, details, i)
            if codes[i] == COLD:
                codes[i:full] = [COLD] * (full - i)
            else:
                for j in range(i + 1, full):
                    key = hashes[j] + GID0
                    if cached(key) is not None:
                        codes[j] = CHAIN_BROKEN
                        continue
                    codes[j] = self._history(key, now, details, j)
                    if codes[j] == COLD:
                        codes[j:full] = [COLD] * (full - j)
                        break
        for j in range(full, total):  # the partial tail (or hashes not sent)
            codes[j] = FLOOR
            tail = prompt - j * bs
            if tail < bs:
                details[j] = {"partial": True, "tokens": tail}
        for j, c in enumerate(codes):
            self.blocks[c] += 1
            self.tokens[c] += min(bs, prompt - j * bs)
        self.admissions += 1
        return [None if c == 0 else REASONS[c - 1] for c in codes], details

    def _history(self, key: bytes, now: float, details: dict[int, Any], i: int) -> int:
        g = self.gone.get(key)
        if g is None:
            return COLD
        cause, ts, bid = g
        details[i] = {"cause": CAUSES[cause], "ago_seconds": max(0.0, now - ts), "block_id": bid}
        return RESET_DROP if cause == 2 else EVICTED

    # ----------------------------------------------------------------- views

    def section(self) -> dict[str, Any]:
        """The stream's ``analysis`` figures of the miss reasons (the engine's)."""
        return {
            "misses": {name: self.blocks[c] for c, name in enumerate(REASONS, start=1)},
            "miss_tokens": {name: self.tokens[c] for c, name in enumerate(REASONS, start=1)},
            "hit_blocks": self.blocks[0],
        }

    def view(self) -> dict[str, Any]:
        """What ``GET /api/misses`` says of the engine's requests."""
        missed = sum(self.blocks[1:])
        return {
            "admissions": self.admissions,
            "hit": {"blocks": self.blocks[0], "tokens": self.tokens[0]},
            "missed": {"blocks": missed, "tokens": sum(self.tokens[1:])},
            "reasons": {
                name: {
                    "blocks": self.blocks[c],
                    "tokens": self.tokens[c],
                    "share": self.blocks[c] / missed if missed else 0.0,
                }
                for c, name in enumerate(REASONS, start=1)
            },
            "engine_requests": True,
            "dropped_hashes_remembered": len(self.gone),
        }
