"""One instance's prefix cache as its KV events describe it.

The hash map is ``hash -> entry``: how many physical copies hold the hash
(BlockStored adds one per hash, BlockRemoved takes one away -- vLLM does not
de-duplicate, so two blocks may share a hash), per storage medium and per
KV-cache group (vLLM >= 0.24's ``group_idx``: a hybrid model's full-attention
and sliding-window groups each store their own block of a hash, and free
them apart), and what the first BlockStored said about it: its parent (the prefix tree), its tokens,
block size and LoRA.  AllBlocksCleared empties it.

That is all an observer can know.  Block ids, reference counts, which blocks
are free or in use, the free queue's order and the pool's size never appear
in events; neither do blocks cached before the observer's first event (unless
a replay from seq 0 covers them).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from blockpool.kvevents.hashes import Hash, hash_hex
from blockpool.kvevents.observed import ClearedEvent, ObservedEvent, RemovedEvent, StoredEvent
from blockpool.runtime import prefix_tree


class Entry:
    __slots__ = (
        "block_size",
        "copies",
        "groups",
        "lora_id",
        "lora_name",
        "media",
        "parent",
        "stored_seq",
        "stored_ts",
        "tokens",
    )

    def __init__(
        self,
        parent: Hash | None,
        tokens: Sequence[int],
        block_size: int,
        lora_id: int | None,
        lora_name: str | None,
        medium: str | None,
        seq: int,
        ts: float,
        group: int | None = None,
    ) -> None:
        self.parent = parent
        self.tokens = tokens
        self.block_size = block_size
        self.lora_id = lora_id
        self.lora_name = lora_name
        self.media: dict[str | None, int] = {medium: 1}
        self.groups: dict[int | None, int] = {group: 1}  # (group_idx, hash) -> copies
        self.copies = 1
        self.stored_seq = seq
        self.stored_ts = ts


class InstanceState:
    """The rebuilt hash map of one stream; ``apply`` is the only mutator."""

    def __init__(self, max_keys: int | None = None) -> None:
        self.max_keys = max_keys  # hashes held at most (None: no cap)
        self.overflow = 0  # stored blocks not kept because the cap was reached
        self.entries: dict[Hash, Entry] = {}
        self.blocks = 0  # sum of copies
        self.block_size: int | None = None  # the latest BlockStored's
        self.stored_blocks = 0
        self.removed_blocks = 0
        self.clears = 0
        self.unknown_removals = 0  # BlockRemoved of a hash not held
        self.multi_copy_keys = 0  # hashes held by more than one block
        self.media_blocks: dict[str | None, int] = {}  # blocks per medium
        self.group_blocks: dict[int | None, int] = {}  # blocks per KV-cache group
        self.group_specs: dict[int, dict[str, Any]] = {}  # group -> its cache spec
        self.events = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}

    def reset(self) -> None:
        self.entries.clear()
        self.blocks = 0
        self.multi_copy_keys = 0
        self.media_blocks.clear()
        self.group_blocks.clear()

    def apply(self, events: Iterable[ObservedEvent], seq: int, ts: float) -> None:
        for ev in events:
            if isinstance(ev, StoredEvent):
                self._stored(ev, seq, ts)
            elif isinstance(ev, RemovedEvent):
                self._removed(ev)
            elif isinstance(ev, ClearedEvent):
                self.events["AllBlocksCleared"] += 1
                self.clears += 1
                self.reset()

    def _stored(self, ev: StoredEvent, seq: int, ts: float) -> None:
        self.events["BlockStored"] += 1
        entries = self.entries
        parent = ev.parent
        size = ev.block_size
        tokens = ev.token_ids
        if size:
            self.block_size = size
        group = ev.group
        if group is not None and (ev.spec_kind is not None or ev.sliding_window is not None):
            self.group_specs[group] = {"kind": ev.spec_kind, "sliding_window": ev.sliding_window}
        cap = self.max_keys
        kept = 0
        for i, h in enumerate(ev.hashes):
            entry = entries.get(h)
            if entry is None:
                if cap is not None and len(entries) >= cap:
                    self.overflow += 1  # over the cap: not kept (the state is then partial)
                    parent = h
                    continue
                chunk = _packed(tokens[i * size : (i + 1) * size]) if size else _EMPTY
                entries[h] = Entry(
                    parent, chunk, size, ev.lora_id, ev.lora_name, ev.medium, seq, ts, group
                )
            else:
                if entry.copies == 1:
                    self.multi_copy_keys += 1
                entry.copies += 1
                entry.media[ev.medium] = entry.media.get(ev.medium, 0) + 1
                entry.groups[group] = entry.groups.get(group, 0) + 1
            kept += 1
            parent = h
        if kept or not ev.hashes:
            media = self.media_blocks
            media[ev.medium] = media.get(ev.medium, 0) + kept
            groups = self.group_blocks
            groups[group] = groups.get(group, 0) + kept
        self.blocks += kept
        self.stored_blocks += len(ev.hashes)

    def _removed(self, ev: RemovedEvent) -> None:
        self.events["BlockRemoved"] += 1
        entries = self.entries
        for h in ev.hashes:
            entry = entries.get(h)
            if entry is None:
                self.unknown_removals += 1
                continue
            media = entry.media
            medium = _which(media, ev.medium)
            group = _which(entry.groups, ev.group)
            if medium is _NONE or group is _NONE:
                self.unknown_removals += 1
                continue
            _take(media, medium)
            _take(entry.groups, group)
            _take(self.group_blocks, group)
            entry.copies -= 1
            if entry.copies == 1:
                self.multi_copy_keys -= 1
            _take(self.media_blocks, medium)
            self.blocks -= 1
            self.removed_blocks += 1
            if entry.copies <= 0:
                del entries[h]

    # ---------------------------------------------------------------- reads

    def group_copies(self) -> dict[tuple[int | None, Hash], int]:
        """(group_idx, hash) -> copies: the per-group map."""
        return {(g, h): n for h, e in self.entries.items() for g, n in e.groups.items()}

    def check(self) -> None:
        """The kept figures against a recount (tests)."""
        entries = self.entries.values()
        assert self.blocks == sum(e.copies for e in entries), "blocks"
        assert self.multi_copy_keys == sum(1 for e in entries if e.copies > 1), "multi"
        media: dict[str | None, int] = {}
        for e in entries:
            assert e.copies == sum(e.media.values()) and e.copies > 0, "entry copies"
            for m, n in e.media.items():
                media[m] = media.get(m, 0) + n
        assert media == self.media_blocks, "media"
        groups: dict[int | None, int] = {}
        for e in entries:
            assert e.copies == sum(e.groups.values()), "entry groups"
            for g, n in e.groups.items():
                assert n > 0, "group copies"
                groups[g] = groups.get(g, 0) + n
        assert groups == {g: n for g, n in self.group_blocks.items() if n}, "groups"

    def copies(self) -> dict[Hash, int]:
        """hash -> copies: the map to compare against a pool's."""
        return {h: e.copies for h, e in self.entries.items()}

    def chain(self, h: Hash) -> list[Hash]:
        """``h`` and its ancestors this instance holds, root first."""
        out: list[Hash] = []
        seen: set[Hash] = set()
        cur: Hash | None = h
        entries = self.entries
        while cur is not None and cur in entries and cur not in seen:
            seen.add(cur)
            out.append(cur)
            cur = entries[cur].parent
        out.reverse()
        return out

    def leading(self, hashes: list[Hash]) -> int:
        """How many of ``hashes`` (a request's block hashes, in order) this
        instance holds from the first on: its prefix-cache hit in blocks."""
        n = 0
        for h in hashes:
            if h not in self.entries:
                break
            n += 1
        return n

    def match_tokens(self, tokens: list[int], block_size: int | None = None) -> list[Hash]:
        """The longest chain of held blocks whose tokens are the leading
        full blocks of ``tokens`` (parent links and tokens from BlockStored).
        Chains that differ only by LoRA / extra keys are followed alike and
        the deepest wins."""
        size = block_size or self.block_size
        if not size:
            return []
        children = self.children()
        entries = self.entries
        best: list[Hash] = []
        frontier: list[tuple[Hash | None, list[Hash]]] = [(None, [])]
        for start in range(0, len(tokens) - size + 1, size):
            chunk = _packed(tokens[start : start + size])
            nxt: list[tuple[Hash | None, list[Hash]]] = []
            for parent, path in frontier:
                nxt.extend(
                    (c, [*path, c]) for c in children.get(parent, ()) if entries[c].tokens == chunk
                )
            if not nxt:
                break
            frontier = nxt
            best = nxt[0][1]
        return best

    def parents(self) -> dict[Hash, Hash | None]:
        """hash -> its parent (from the first BlockStored): the prefix tree,
        walked with ``blockpool.runtime.prefix_tree``."""
        return {h: e.parent for h, e in self.entries.items()}

    def children(self) -> dict[Hash | None, list[Hash]]:
        """parent -> children; a block whose parent is not held (a first
        block, or one whose parent was evicted first) is a root, under None."""
        return prefix_tree.children(self.parents())

    def depths(self) -> dict[Hash, tuple[Hash, int]]:
        """hash -> (its root among held blocks, depth from 1)."""
        return prefix_tree.depths(self.parents())

    def iter_sorted(self) -> Iterator[tuple[Hash, Entry]]:
        """Entries in the order they were first stored."""
        return iter(sorted(self.entries.items(), key=lambda kv: kv[1].stored_seq))

    def summary(self) -> dict[str, Any]:
        """O(1): every figure is kept up to date by ``apply``."""
        return {
            "keys": len(self.entries),
            "blocks": self.blocks,
            "multi_copy_keys": self.multi_copy_keys,
            "block_size": self.block_size,
            "media": {("-" if m is None else m): n for m, n in self.media_blocks.items()},
            "groups": {("-" if g is None else str(g)): n for g, n in self.group_blocks.items()},
            "group_specs": {str(g): dict(spec) for g, spec in self.group_specs.items()},
            "stored_blocks": self.stored_blocks,
            "removed_blocks": self.removed_blocks,
            "clears": self.clears,
            "unknown_removals": self.unknown_removals,
            "max_keys": self.max_keys,
            "overflow_blocks": self.overflow,
            "event_counts": dict(self.events),
        }


_EMPTY: array[int] = array("q")


def _packed(tokens: list[int]) -> Sequence[int]:
    """A block's token ids as 8 bytes each (a tuple of ints costs ~36 B a
    token); a tuple should one not fit 64 bits (compares unequal to any
    packed chunk: such ids are no real vocabulary's)."""
    try:
        return array("q", tokens)
    except OverflowError:
        return tuple(tokens)


_NONE: Any = object()  # no such medium / group held
K = TypeVar("K")


def _which(held: dict[K, int], wanted: K) -> K:
    """The key a removal takes a copy from: ``wanted`` when held; the only
    one held when the event does not match it (an older publisher leaving
    the field out); otherwise _NONE."""
    if wanted in held:
        return wanted
    return next(iter(held)) if len(held) == 1 else _NONE


def _take(counts: dict[K, int], key: K) -> None:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def entry_json(h: Hash, e: Entry, depth: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hash": hash_hex(h),
        "hash_int": str(h) if isinstance(h, int) else None,
        "parent": None if e.parent is None else hash_hex(e.parent),
        "copies": e.copies,
        "media": {("-" if m is None else m): n for m, n in e.media.items()},
        "groups": {("-" if g is None else str(g)): n for g, n in e.groups.items()},
        "block_size": e.block_size,
        "num_tokens": len(e.tokens),
        "tokens": list(e.tokens[:64]),
        "lora_id": e.lora_id,
        "lora_name": e.lora_name,
        "stored_seq": e.stored_seq,
        "stored_ts": e.stored_ts,
    }
    if depth is not None:
        out["depth"] = depth
    return out
