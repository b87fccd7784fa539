"""KVCacheBlock: the metadata of one physical KV-cache block."""

from __future__ import annotations

from blockpool.core.errors import PoolAssertionError
from blockpool.core.hashing import BlockHashWithGroupId


class KVCacheBlock:
    """One block's metadata; the K/V memory itself lives in storage.

    ``prev_free_block`` / ``next_free_block`` link the block into the free
    queue and belong to FreeKVCacheBlockQueue.  ``block_hash`` can be set only
    while unset: the lifecycle is unset -> set -> reset -> set again.
    """

    __slots__ = (
        "_block_hash",
        "block_id",
        "is_null",
        "next_free_block",
        "prev_free_block",
        "ref_cnt",
    )

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: BlockHashWithGroupId | None = None,
        prev_free_block: KVCacheBlock | None = None,
        next_free_block: KVCacheBlock | None = None,
        is_null: bool = False,
    ) -> None:
        self.block_id = block_id
        self.ref_cnt = ref_cnt
        self._block_hash = _block_hash
        self.prev_free_block = prev_free_block
        self.next_free_block = next_free_block
        self.is_null = is_null

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        if self._block_hash is not None:
            raise PoolAssertionError("The block already has a hash. This should not happen.")
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the hash (the block was evicted from the prefix cache)."""
        self._block_hash = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlock):
            return NotImplemented
        return (
            self.block_id == other.block_id
            and self.ref_cnt == other.ref_cnt
            and self._block_hash == other._block_hash
            and self.prev_free_block is other.prev_free_block
            and self.next_free_block is other.next_free_block
            and self.is_null == other.is_null
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like vLLM's dataclass

    def __repr__(self) -> str:
        prev_id = self.prev_free_block.block_id if self.prev_free_block else None
        next_id = self.next_free_block.block_id if self.next_free_block else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )
