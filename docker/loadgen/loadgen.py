#!/usr/bin/env python3
"""blockpool load generator: drives the REST API the way a test harness would.

Each worker plays one client at a time: it admits a request whose prompt
shares a prefix with others (a few system prompts, a few long documents,
multi-turn conversations that resend their whole history, and some noise),
appends decode tokens in small chunks, and finishes it.  Now and then a whole
short request goes through ``POST /api/batch`` instead, and now and then the
client reads ``GET /api/summary``.

- ``409 not_enough_blocks`` on admit: back off (exponential, jittered) and try
  again; on append: the request is "preempted" (finished early), as a
  scheduler would do when the pool is full.
- ``5xx``: counted; after ``--max-5xx`` of them in a row the run stops with
  exit code 1.  An unreachable server stops it with exit code 3, a refused
  token (401/403) with exit code 4.
- Every ``--stats-interval`` seconds (10) one line of statistics goes to
  stdout; ``--heartbeat FILE`` is touched at the same time (the container's
  health check reads its age).

Settings come from flags or the environment: ``BLOCKPOOL_URL`` (default
http://127.0.0.1:8000), ``BLOCKPOOL_TOKEN`` (optional bearer token),
``LOADGEN_CONCURRENCY``, ``LOADGEN_DURATION`` (seconds; 0 = run forever),
``LOADGEN_HEARTBEAT``, ``LOADGEN_SEED``.

Only the standard library and httpx are needed.  Beside this file:
loadgen_config.py (the settings), loadgen_workload.py (prompts and bodies),
loadgen_stats.py (the statistics line).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from loadgen_config import Config, parse_args
from loadgen_stats import Stats
from loadgen_workload import Prompt, Workload, admit_body, append_body, batch_body

EXIT_OK, EXIT_5XX, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2, 3, 4


class Fatal(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------- client


class LoadGen:
    def __init__(self, config: Config, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.workload = Workload(self.rng)
        self.stats = Stats()
        self.stop = asyncio.Event()
        self.fatal: Fatal | None = None
        self.running: set[str] = set()
        self._consecutive_5xx = 0
        self._consecutive_transport = 0
        headers = {"user-agent": "blockpool-loadgen/1"}
        if config.token:
            headers["authorization"] = f"Bearer {config.token}"
        self.client = httpx.AsyncClient(
            base_url=config.url, headers=headers, timeout=config.timeout, transport=transport
        )

    # ------------------------------------------------------------ one call

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any]:
        """One HTTP call; returns (status, parsed body).  Status 0 means the
        server could not be reached.  Raises Fatal on repeated failures."""
        st = self.stats
        t0 = time.perf_counter()
        try:
            resp = await self.client.request(method, path, json=body)
        except httpx.TransportError as exc:
            st.transport_errors += 1
            self._consecutive_transport += 1
            if self._consecutive_transport >= self.config.max_transport_errors:
                self._fail(EXIT_UNREACHABLE, f"{self.config.url} unreachable: {exc!r}")
            await asyncio.sleep(min(2.0, 0.1 * self._consecutive_transport))
            return 0, None
        self._consecutive_transport = 0
        st.calls += 1
        st.latencies_ms.append((time.perf_counter() - t0) * 1000)
        status = resp.status_code
        try:
            data = resp.json()
        except ValueError:
            data = None
        if status >= 500:
            st.status_5xx += 1
            self._consecutive_5xx += 1
            print(f"[loadgen] {method} {path}: {status} {resp.text[:300]}", flush=True)
            if self._consecutive_5xx >= self.config.max_5xx:
                self._fail(EXIT_5XX, f"{self._consecutive_5xx} server errors (5xx) in a row")
            return status, data
        self._consecutive_5xx = 0
        if status in (401, 403):
            self._fail(EXIT_AUTH, f"{status} from {path}: BLOCKPOOL_TOKEN must be the server's")
        if status == 409:
            st.status_409 += 1
        elif status >= 400:
            st.status_4xx += 1
            if st.status_4xx <= 5:
                print(f"[loadgen] {method} {path}: {status} {resp.text[:300]}", flush=True)
        return status, data

    def _fail(self, code: int, message: str) -> None:
        if self.fatal is None:
            self.fatal = Fatal(code, message)
        self.stop.set()
        raise self.fatal

    @staticmethod
    def error_code(data: Any) -> str | None:
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            code = data["error"].get("code")
            return code if isinstance(code, str) else None
        return None

    async def pause(self, seconds: float) -> None:
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), seconds)

    # ------------------------------------------------------------ scenarios

    async def one_request(self) -> None:
        wl, cfg, st = self.workload, self.config, self.stats
        prompt = wl.next_prompt()
        rid = wl.new_request_id()
        output: list[int] = []
        ok = False
        try:
            if self.rng.random() < cfg.batch_fraction:
                ok = await self.batched(rid, prompt, output)
                return
            if not await self.admit(rid, prompt):
                return
            self.running.add(rid)
            try:
                for n in wl.decode_plan(*cfg.decode_tokens):
                    if self.stop.is_set():
                        break
                    tokens = wl.tokens(n)
                    status, data = await self.call(
                        "POST", f"/api/requests/{rid}/tokens", append_body(tokens)
                    )
                    if status == 200:
                        output.extend(tokens)
                        st.appended_tokens += n
                    elif status == 409 and self.error_code(data) == "not_enough_blocks":
                        st.preempted += 1  # the pool is full: give the blocks back
                        break
                    elif status in (404, 409):
                        return  # the request is gone (a reset, another client)
                    await self.pause(cfg.think_time)
                else:
                    ok = True
            finally:
                await self.finish(rid)
        finally:
            wl.end_turn(prompt, output, ok)
            if self.rng.random() < cfg.summary_fraction:
                await self.call("GET", "/api/summary")

    async def admit(self, rid: str, prompt: Prompt) -> bool:
        st = self.stats
        delay = 0.05
        for attempt in range(8):
            if self.stop.is_set():
                return False
            status, data = await self.call("POST", "/api/requests", admit_body(rid, prompt))
            if status == 201:
                st.admitted += 1
                st.prompt_tokens += len(prompt.token_ids)
                st.hit_tokens += int(data.get("num_computed_tokens", 0))
                return True
            full = status == 409 and self.error_code(data) == "not_enough_blocks"
            if full or status in (0, 503):
                if attempt:
                    st.admit_retries += 1
                await self.pause(delay * (0.5 + self.rng.random()))
                delay = min(2.0, delay * 2)
                continue
            return False  # refused for another reason: drop this request
        st.gave_up += 1
        return False

    async def finish(self, rid: str) -> None:
        self.running.discard(rid)
        for _ in range(3):
            status, _ = await self.call("POST", f"/api/requests/{rid}/finish")
            if status == 200:
                self.stats.finished += 1
                return
            if status in (404, 409):
                return
            await asyncio.sleep(0.1)

    async def batched(self, rid: str, prompt: Prompt, output: list[int]) -> bool:
        st = self.stats
        decode = [self.workload.tokens(n) for n in self.workload.decode_plan(2, 24)]
        status, data = await self.call("POST", "/api/batch", batch_body(rid, prompt, decode))
        if status != 200 or not isinstance(data, dict):
            return False
        st.batches += 1
        results = data.get("results", [])
        if len(results) > 1 and results[1].get("ok"):
            st.admitted += 1
            st.prompt_tokens += len(prompt.token_ids)
            st.hit_tokens += int(results[1]["result"].get("num_computed_tokens", 0))
        if results and results[-1].get("ok"):
            st.finished += 1
        for res, toks in zip(results[2:-1], decode, strict=False):
            if res.get("ok"):
                output.extend(toks)
                st.appended_tokens += len(toks)
        if not all(r.get("ok") for r in results):
            await self.pause(0.05 + 0.1 * self.rng.random())  # the pool is tight
            return False
        return True

    # -------------------------------------------------------------- drivers

    async def worker(self) -> None:
        while not self.stop.is_set():
            try:
                await self.one_request()
            except Fatal:
                return

    async def reporter(self) -> None:
        while not self.stop.is_set():
            self.beat()
            await self.pause(self.config.stats_interval)
            if not self.stop.is_set():
                print(self.stats.line(len(self.running)), flush=True)

    def beat(self) -> None:
        if self.config.heartbeat:
            path = Path(self.config.heartbeat)
            with contextlib.suppress(OSError):
                path.touch()

    async def wait_ready(self) -> None:
        deadline = time.monotonic() + self.config.wait_ready
        while True:
            self.beat()
            try:
                resp = await self.client.get("/api/health")
                if resp.status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() >= deadline:
                raise Fatal(EXIT_UNREACHABLE, f"{self.config.url}/api/health never answered 200")
            await self.pause(1.0)
            if self.stop.is_set():
                return

    async def run(self) -> int:
        cfg = self.config
        try:
            await self.wait_ready()
            print(
                f"[loadgen] driving {cfg.url} with {cfg.concurrency} workers"
                + (f" for {cfg.duration:g}s" if cfg.duration else " until stopped"),
                flush=True,
            )
            tasks = [asyncio.create_task(self.worker()) for _ in range(cfg.concurrency)]
            reporter = asyncio.create_task(self.reporter())
            if cfg.duration:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), cfg.duration)
                self.stop.set()
            else:
                await self.stop.wait()
            # Workers finish the request they hold (its blocks go back), then stop.
            _, pending = await asyncio.wait(tasks, timeout=10)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            reporter.cancel()
            await asyncio.gather(reporter, return_exceptions=True)
        except Fatal as exc:
            self.fatal = self.fatal or exc
        finally:
            await self.client.aclose()
        print(self.stats.line(len(self.running)), flush=True)
        if self.fatal is not None:
            print(f"[loadgen] stopping: {self.fatal}", file=sys.stderr, flush=True)
            return self.fatal.code
        return EXIT_OK


async def run(config: Config, transport: httpx.AsyncBaseTransport | None = None) -> int:
    """Run until the duration ends or a stop; returns the exit code."""
    return await LoadGen(config, transport).run()


async def _main_async(config: Config) -> int:
    gen = LoadGen(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, gen.stop.set)
    return await gen.run()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    return asyncio.run(_main_async(config))


if __name__ == "__main__":
    sys.exit(main())
