"""The request stream: seeded multi-turn conversations, or a Mooncake trace.

A ``Workload`` hands out ``Planned`` requests (id, prompt token ids, output
length, the reply the fake model samples) on demand, so the driver can keep a
fixed number in the engine: a new one whenever another finishes.  Two
workloads built with the same arguments hand out the same requests in the same
order, whatever the engine does in between, except that a conversation's next
turn is only issued once its previous turn finished (the driver says so with
``finished``); the plain and the plugin runs finish the same requests at the
same steps, so they see the same stream.

Conversations: one of a few shared system prompts, a first user message, then
turns that each append the previous reply and a new user message (the prefix
of a turn is the whole previous turn, as in a chat).  A conversation ends when
its next prompt would pass ``max_prompt`` tokens or after its last turn.

Trace (``--trace FILE``): Mooncake JSONL, one request a line with
``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token
block); a block's tokens are a function of its id, so requests that share ids
share prefixes.  Lines are issued in file order (timestamps ignored); the file
is replayed from the top when it runs out, with fresh ids only in the tokens
of the last, partial block (so a replay hits what is still cached).
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

VOCAB_LO, VOCAB_HI = 100, 31_999
TRACE_BLOCK = 512


@dataclass
class Planned:
    req_id: str
    prompt: list[int]
    max_tokens: int
    reply: list[int]  # the tokens the fake model samples, in order
    conversation: int = -1


@dataclass
class _Conversation:
    cid: int
    history: list[int]
    turns_left: int


@dataclass
class WorkloadStats:
    issued: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    conversations: int = 0
    turns_by_conversation: dict[int, int] = field(default_factory=dict)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(VOCAB_LO, VOCAB_HI) for _ in range(n)]


class Workload:
    """Seeded multi-turn chat traffic (see the module doc)."""

    def __init__(
        self,
        seed: int = 0,
        *,
        max_prompt: int = 8192,
        min_prompt: int = 1024,
        system_prompts: int = 8,
        system_len: tuple[int, int] = (256, 2048),
        user_len: tuple[int, int] = (64, 3072),
        output_len: tuple[int, int] = (32, 512),
        turns: tuple[int, int] = (1, 6),
    ) -> None:
        self.rng = random.Random(seed)
        self.max_prompt = max_prompt
        self.min_prompt = min(min_prompt, max_prompt)
        self.user_len = user_len
        self.output_len = output_len
        self.turns = turns
        self.systems = [
            _tokens(self.rng, self.rng.randint(*system_len)) for _ in range(system_prompts)
        ]
        self.ready: deque[_Conversation] = deque()  # conversations whose next turn may go
        self.waiting: dict[str, _Conversation] = {}  # req_id -> its conversation
        self.next_cid = 0
        self.next_req = 0
        self.stats = WorkloadStats()

    def _new_conversation(self) -> _Conversation:
        rng = self.rng
        cid = self.next_cid
        self.next_cid += 1
        self.stats.conversations += 1
        history = list(rng.choice(self.systems))
        # the first prompt: at least min_prompt tokens, so the pool fills
        want = rng.randint(self.min_prompt, self.max_prompt)
        history += _tokens(rng, max(1, want - len(history)))
        return _Conversation(cid, history[: self.max_prompt], rng.randint(*self.turns))

    def next(self) -> Planned:
        """The next request to add."""
        rng = self.rng
        conv = self.ready.popleft() if self.ready else self._new_conversation()
        rid = f"c{conv.cid}-r{self.next_req}"
        self.next_req += 1
        out_n = rng.randint(*self.output_len)
        reply = _tokens(rng, out_n)
        plan = Planned(rid, list(conv.history), out_n, reply, conv.cid)
        conv.turns_left -= 1
        extra = rng.randint(*self.user_len)
        if conv.turns_left > 0 and len(conv.history) + out_n + extra <= self.max_prompt:
            conv.history += reply + _tokens(rng, extra)
            self.waiting[rid] = conv
        self.stats.issued += 1
        self.stats.prompt_tokens += len(plan.prompt)
        self.stats.output_tokens += out_n
        turns = self.stats.turns_by_conversation
        turns[conv.cid] = turns.get(conv.cid, 0) + 1
        return plan

    def finished(self, req_id: str) -> None:
        """``req_id`` is done: its conversation's next turn may be issued."""
        conv = self.waiting.pop(req_id, None)
        if conv is not None:
            self.ready.append(conv)

    def summary(self) -> dict[str, float | int | str]:
        s = self.stats
        turns = list(s.turns_by_conversation.values()) or [0]
        return {
            "kind": "conversations",
            "issued": s.issued,
            "conversations": s.conversations,
            "mean_turns": round(sum(turns) / len(turns), 2),
            "mean_prompt_tokens": round(s.prompt_tokens / max(1, s.issued), 1),
            "mean_output_tokens": round(s.output_tokens / max(1, s.issued), 1),
        }


def _block_tokens(hash_id: int) -> list[int]:
    return _tokens(random.Random(hash_id * 2_654_435_761 + 17), TRACE_BLOCK)


class TraceWorkload:
    """A Mooncake JSONL trace, issued in file order (see the module doc)."""

    def __init__(
        self, path: Path, seed: int = 0, *, max_prompt: int = 8192, max_output: int = 512
    ) -> None:
        self.rows: list[tuple[int, int, list[int]]] = []
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            self.rows.append(
                (int(row["input_length"]), int(row["output_length"]), list(row["hash_ids"]))
            )
        if not self.rows:
            raise ValueError(f"{path}: no requests")
        self.rng = random.Random(seed)
        self.max_prompt = max_prompt
        self.max_output = max_output
        self.cache: dict[int, list[int]] = {}
        self.pos = 0
        self.replays = 0
        self.issued = 0
        self.prompt_tokens = 0

    def _block(self, hash_id: int) -> list[int]:
        got = self.cache.get(hash_id)
        if got is None:
            if len(self.cache) > 50_000:
                self.cache.clear()
            got = self.cache[hash_id] = _block_tokens(hash_id)
        return got

    def next(self) -> Planned:
        if self.pos == len(self.rows):
            self.pos = 0
            self.replays += 1
        n_in, n_out, ids = self.rows[self.pos]
        self.pos += 1
        n_in = max(1, min(n_in, self.max_prompt))
        prompt: list[int] = []
        for h in ids:
            if len(prompt) >= n_in:
                break
            prompt += self._block(h)
        if len(prompt) < n_in:  # fewer ids than the length needs: unique filler
            prompt += _tokens(self.rng, n_in - len(prompt))
        prompt = prompt[:n_in]
        if self.replays:  # a replayed line: its partial tail differs from the first pass
            tail = n_in % TRACE_BLOCK or TRACE_BLOCK
            prompt[-tail:] = _tokens(self.rng, tail)
        n_out = max(1, min(n_out, self.max_output))
        plan = Planned(f"t{self.issued}", prompt, n_out, _tokens(self.rng, n_out))
        self.issued += 1
        self.prompt_tokens += n_in
        return plan

    def finished(self, req_id: str) -> None:
        pass

    def summary(self) -> dict[str, float | int | str]:
        return {
            "kind": "trace",
            "issued": self.issued,
            "trace_rows": len(self.rows),
            "replays": self.replays,
            "mean_prompt_tokens": round(self.prompt_tokens / max(1, self.issued), 1),
        }
