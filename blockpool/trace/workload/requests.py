"""A validated trace: its requests in arrival order and their token ids
(``hash id h`` at offset ``j`` is the token ``h * tokens_per_id + j``;
outputs unique per request, above every prompt token)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

TOKENS_PER_ID = 512


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace.  Either ``hash_ids`` (Mooncake) or
    ``token_ids`` (a recording) describe the prompt."""

    index: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    line: int = 0
    priority: int = 0  # the scheduler's priority policy: lower runs first


@dataclass
class Trace:
    """A validated trace: its requests in arrival order."""

    requests: list[TraceRequest]
    tokens_per_id: int = TOKENS_PER_ID
    source: str = "mooncake"
    _output_base: int = field(default=-1, repr=False)
    _output_offsets: list[int] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    def prompt_token_ids(
        self, req: TraceRequest, start: int = 0, stop: int | None = None
    ) -> list[int]:
        """The prompt's token ids (``[start:stop]`` of them; only those are built)."""
        end = req.input_length if stop is None else min(stop, req.input_length)
        if req.token_ids is not None:
            return list(req.token_ids[start:end])
        if start >= end:
            return []
        tpi = self.tokens_per_id
        ids = req.hash_ids
        first, last = start // tpi, (end - 1) // tpi
        spans = (
            range(
                ids[k] * tpi + (start - k * tpi if k == first else 0),
                ids[k] * tpi + (end - k * tpi if k == last else tpi),
            )
            for k in range(first, last + 1)
        )
        return list(chain.from_iterable(spans))

    def output_token_ids(
        self, req: TraceRequest, start: int = 0, stop: int | None = None
    ) -> list[int]:
        """``output_length`` token ids no other request and no prompt uses
        (``[start:stop]`` of them)."""
        if self._output_base < 0:
            self._plan_outputs()
        first = self._output_base + self._output_offsets[req.index]
        end = req.output_length if stop is None else min(stop, req.output_length)
        return list(range(first + start, first + end)) if start < end else []

    def max_token_id(self) -> int:
        """The largest token id any prompt or output of the trace uses."""
        if self._output_base < 0:
            self._plan_outputs()
        outputs = sum(r.output_length for r in self.requests)
        return self._output_base + outputs - 1 if outputs else self._output_base - 1

    def _plan_outputs(self) -> None:
        top = 0
        for r in self.requests:
            if r.token_ids is not None:
                top = max(top, max(r.token_ids, default=0) + 1)
            elif r.hash_ids:
                top = max(top, (max(r.hash_ids) + 1) * self.tokens_per_id)
        offsets, acc = [], 0
        for r in self.requests:
            offsets.append(acc)
            acc += r.output_length
        self._output_base, self._output_offsets = top, offsets
