"""The load generator's workload: prompts that share prefixes (system
prompts, documents, multi-turn conversations, noise), decode plans, and the
request bodies they become; no I/O."""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass
from typing import Any

VOCAB = 32_000
MAX_PROMPT_TOKENS = 6_000


@dataclass
class Prompt:
    kind: str
    token_ids: list[int]
    conversation: int | None = None
    lora_name: str | None = None


class Workload:
    """Builds prompts and request bodies; does no I/O (the tests use it alone)."""

    KINDS = ("chat", "document", "conversation", "noise")
    WEIGHTS = (4, 2, 3, 1)

    def __init__(self, rng: random.Random, run_tag: str | None = None) -> None:
        self.rng = rng
        self.run_tag = run_tag or secrets.token_hex(3)
        self._seq = 0
        self.system_prompts = [self.tokens(rng.randint(64, 480)) for _ in range(6)]
        self.documents = [self.tokens(rng.randint(480, 1600)) for _ in range(4)]
        self.conversations: list[list[int]] = [[] for _ in range(16)]
        self.busy: set[int] = set()

    def tokens(self, n: int) -> list[int]:
        r = self.rng.randrange
        return [r(VOCAB) for _ in range(n)]

    def new_request_id(self) -> str:
        self._seq += 1
        return f"lg-{self.run_tag}-{self._seq}"

    def next_prompt(self) -> Prompt:
        r = self.rng
        kind = r.choices(self.KINDS, weights=self.WEIGHTS)[0]
        if kind == "chat":
            system = r.choice(self.system_prompts)
            # One in ten chats runs under a LoRA adapter: same text, other hashes.
            lora = "adapter-a" if r.random() < 0.1 else None
            return Prompt(kind, system + self.tokens(r.randint(8, 120)), lora_name=lora)
        if kind == "document":
            return Prompt(kind, r.choice(self.documents) + self.tokens(r.randint(8, 64)))
        if kind == "conversation":
            free = [i for i in range(len(self.conversations)) if i not in self.busy]
            if free:
                conv = r.choice(free)
                history = self.conversations[conv]
                if not history or len(history) > MAX_PROMPT_TOKENS - 400:
                    history = self.conversations[conv] = r.choice(self.system_prompts)[:]
                self.busy.add(conv)
                return Prompt(kind, history + self.tokens(r.randint(8, 80)), conversation=conv)
        return Prompt("noise", self.tokens(r.randint(16, 400)))

    def end_turn(self, prompt: Prompt, output: list[int], ok: bool) -> None:
        """A conversation's next turn resends this turn's prompt and reply."""
        if prompt.conversation is None:
            return
        self.busy.discard(prompt.conversation)
        if ok:
            self.conversations[prompt.conversation] = prompt.token_ids + output

    def decode_plan(self, lo: int, hi: int) -> list[int]:
        """Decode chunk sizes (tokens per append call) for one request."""
        left = self.rng.randint(lo, hi)
        chunks: list[int] = []
        while left > 0:
            n = min(left, self.rng.randint(1, 16))
            chunks.append(n)
            left -= n
        return chunks


def admit_body(request_id: str, prompt: Prompt) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": request_id, "token_ids": prompt.token_ids}
    if prompt.lora_name is not None:
        body["lora_name"] = prompt.lora_name
    return body


def append_body(token_ids: list[int]) -> dict[str, Any]:
    return {"token_ids": token_ids}


def batch_body(request_id: str, prompt: Prompt, decode: list[list[int]]) -> dict[str, Any]:
    """A whole short request in one call.  ``on_error: continue`` so that the
    finish still runs when an append is refused (a refused admit makes the
    later operations 404, which frees nothing and changes nothing)."""
    ops: list[dict[str, Any]] = [{"op": "prefix_lookup", "token_ids": prompt.token_ids}]
    admit = {"op": "admit", **admit_body(request_id, prompt)}
    ops.append(admit)
    ops.extend({"op": "append", "request_id": request_id, "token_ids": t} for t in decode)
    ops.append({"op": "finish", "request_id": request_id})
    return {"ops": ops, "on_error": "continue"}
