"""A request as the pool sees it: token ids, block hashes, extra keys.

Duck-type compatible with what vLLM's BlockPool and request block hasher read
(``all_token_ids``, ``num_tokens``, ``block_hashes``, ``lora_request``,
``mm_features``, ``cache_salt``, ``prompt_embeds``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from blockpool.core.hashing import BlockHash


@dataclass(frozen=True)
class LoRARequest:
    """The LoRA adapter a request uses: its name enters the block hashes."""

    lora_name: str
    lora_int_id: int = 1

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id


@dataclass(frozen=True)
class PlaceholderRange:
    """Where a multimodal input sits among the prompt tokens."""

    offset: int
    length: int


@dataclass(frozen=True)
class MultiModalFeature:
    """A multimodal input: its content identifier enters the block hashes of
    the blocks it overlaps."""

    identifier: str
    mm_position: PlaceholderRange


class Request:
    """Token ids of one request and the hashes of its full blocks.

    With a ``block_hasher`` the hashes follow the tokens: they are computed
    at creation and extended by ``append_output_token_ids``.

    ``prompt_embeds`` (a tensor, one row per prompt token) enters the hashes
    of the blocks it covers.  Without ``prompt_token_ids`` (None) the prompt
    is that many placeholder tokens 0, as in vLLM.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Iterable[int] | None,
        *,
        block_hasher: Callable[[Request], list[BlockHash]] | None = None,
        lora_request: LoRARequest | None = None,
        cache_salt: str | None = None,
        mm_features: list[MultiModalFeature] | None = None,
        prompt_embeds: Any = None,
    ) -> None:
        self.request_id = request_id
        if prompt_token_ids is not None:
            self.prompt_token_ids = list(prompt_token_ids)
            if prompt_embeds is not None and len(prompt_embeds) != len(self.prompt_token_ids):
                raise ValueError(
                    f"prompt_token_ids ({len(self.prompt_token_ids)}) and prompt_embeds "
                    f"({len(prompt_embeds)}) have different lengths"
                )
        elif prompt_embeds is not None:
            self.prompt_token_ids = [0] * len(prompt_embeds)
        else:
            raise ValueError("a request needs prompt_token_ids or prompt_embeds")
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features: list[MultiModalFeature] = list(mm_features or [])
        self.prompt_embeds: Any = prompt_embeds
        self.num_preemptions = 0
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes = block_hasher(self)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    def append_output_token_ids(self, token_ids: int | Iterable[int]) -> None:
        if isinstance(token_ids, int):
            self.all_token_ids.append(token_ids)
        else:
            self.all_token_ids.extend(token_ids)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))
