"""Streaming completions in flight on a real engine, one thread each."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

from tests.vllm_engine.engine import block_tokens


class Stream(threading.Thread):
    """A streaming completion of ``max_tokens`` tokens (EOS ignored): ``first``
    is set at its first chunk (or its failure), ``ids`` the ids the client got;
    ``abort`` closes it (the client goes away: vLLM aborts the request)."""

    def __init__(self, url: str, n: int, max_tokens: int, blocks: int = 2) -> None:
        super().__init__(daemon=True, name=f"stream-{n}")
        self.url = url
        self.prompt = [t for b in range(blocks) for t in block_tokens(50_000 + 100 * n + b)]
        self.max_tokens = max_tokens
        self.first = threading.Event()
        self.stop = threading.Event()
        self.ids: set[str] = set()
        self.chunks = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        body: dict[str, Any] = {
            "model": "tiny",
            "prompt": self.prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with (
                httpx.Client(timeout=600) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=body) as r,
            ):
                r.raise_for_status()
                for line in r.iter_lines():
                    if self.stop.is_set():
                        return  # the response closed: the connection with it
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    self.ids.add(json.loads(line[6:])["id"])
                    self.chunks += 1
                    self.first.set()
        except BaseException as exc:  # the test reads it
            self.error = exc
        finally:
            self.first.set()


def abort(streams: list[Stream]) -> None:
    """Every stream closed by its client, and its thread ended."""
    for s in streams:
        s.stop.set()
    for s in streams:
        s.join(600)
        assert not s.is_alive()


def start_streams(url: str, count: int, max_tokens: int, first: int = 0) -> list[Stream]:
    """``count`` streams of distinct prompts (numbered from ``first``)."""
    streams = [Stream(url, first + n, max_tokens) for n in range(count)]
    for s in streams:
        s.start()
    return streams
