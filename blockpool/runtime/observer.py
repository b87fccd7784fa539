"""How the analysis sees operations: a typed change and the observer's methods.

``PoolRuntime.execute`` applies an operation in this order (``PoolRuntime._changed``):

1. the handler validates the whole operation, then changes the pool, the
   manager and the raw references (a refusal raises before any change);
2. blocks that reached the free queue are stamped in the order they were
   appended (``BlockColumns.stamp_freed``);
3. the observer is told (one method per kind of change) -- after the pool
   changed, before the columns are re-read, so the columns still show the
   touched blocks' previous state (which hash a reused block lost, where it
   stood in the queue), and ``counters.blocks_allocated`` still counts the
   blocks allocated before this operation;
4. the touched blocks are re-read into the columns (a reset re-reads all);
5. the allocation counter moves on; K/V storage writes what was computed;
6. the recorder keeps the operation, its result and its events;
7. the pool's events and eviction samples go into the sequenced logs.

Reads (lookups) change nothing and notify nobody.  A jump of the pool to
another pool's state (``PoolRuntime.restore``: a mirror's resync from the
engine's snapshot) is no operation: the observer is told ``on_resync`` once,
after the columns were re-read and the recorder kept a keyframe.

Several observers (the analysis, a mirror's engine misses) are each told, in
the order they were added (``PoolRuntime.observe``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from blockpool.core.block import KVCacheBlock
    from blockpool.core.manager import Admission, ManagedRequest


class AdmitFields(Protocol):
    """What the observer reads of an admission's operation (``AdmitOp``)."""

    request_id: str | None
    token_ids: list[int]
    lora_name: str | None
    cache_salt: str | None


class ChangeKind(enum.Enum):
    """What kind of change an operation made (each operation declares its own)."""

    ALLOCATE = "allocate"
    FREE = "free"
    TOUCH = "touch"
    CACHE = "cache"
    EVICT = "evict"
    RESET = "reset"
    ADMIT = "admit"
    APPEND = "append"
    FINISH = "finish"


@dataclass(slots=True)
class Change:
    """What one operation did, for the observer and the columns."""

    kind: ChangeKind
    sync: Sequence[Iterable[int]] = ()  # block ids to re-read
    freed: Sequence[Sequence[KVCacheBlock]] = ()  # passed to free_blocks, in order
    ids: list[int] = field(default_factory=list)  # allocate: new ids; evict: evicted ids
    hashes: Sequence[bytes] = ()  # cache: the hashes set
    request_id: str | None = None
    op: AdmitFields | None = None  # admit: the operation (an AdmitOp)
    admission: Admission | None = None
    managed: ManagedRequest | None = None
    before_tokens: int = 0  # append
    before_cached: int = 0  # append
    added: list[list[int]] = field(default_factory=list)  # append: new ids per group
    write_from: int | None = None  # storage: tokens from here on were computed
    allocated: int = 0  # blocks this operation allocated


class OpObserver(Protocol):
    """Told of every change, in the order above (see ``Change``).  Each
    method does nothing here: an observer that needs a few notifications
    subclasses this and overrides those."""

    def on_allocate(self, ids: list[int]) -> None:
        return None

    def on_freed(self, first_stamp: int, now: float | None = None) -> None:
        return None

    def on_cache(self, hashes: Sequence[bytes]) -> None:
        return None

    def on_evict(self, ids: list[int]) -> None:
        return None

    def on_reset(self) -> None:
        return None

    def on_admit(self, rid: str, op: AdmitFields, adm: Admission) -> None:
        return None

    def on_append(
        self,
        rid: str,
        managed: ManagedRequest,
        before_tokens: int,
        before_cached: int,
        added: list[list[int]],
    ) -> None:
        return None

    def on_finish(self, rid: str, managed: ManagedRequest, first_stamp: int) -> None:
        return None

    def on_resync(self) -> None:
        return None


def notify(obs: OpObserver, ch: Change, first_stamp: int) -> None:
    """Step 3: the one dispatch from a change to the observer's methods."""
    kind = ch.kind
    if kind is ChangeKind.ADMIT:
        assert ch.request_id is not None and ch.admission is not None and ch.op is not None
        obs.on_admit(ch.request_id, ch.op, ch.admission)
    elif kind is ChangeKind.APPEND:
        assert ch.request_id is not None and ch.managed is not None
        obs.on_append(ch.request_id, ch.managed, ch.before_tokens, ch.before_cached, ch.added)
    elif kind is ChangeKind.FINISH:
        assert ch.request_id is not None and ch.managed is not None
        obs.on_finish(ch.request_id, ch.managed, first_stamp)
    elif kind is ChangeKind.FREE:
        obs.on_freed(first_stamp)
    elif kind is ChangeKind.ALLOCATE:
        obs.on_allocate(ch.ids)
    elif kind is ChangeKind.CACHE:
        obs.on_cache(ch.hashes)
    elif kind is ChangeKind.EVICT:
        obs.on_evict(ch.ids)
    elif kind is ChangeKind.RESET:
        obs.on_reset()
    # TOUCH: re-read into the columns only; the analysis has nothing to learn
