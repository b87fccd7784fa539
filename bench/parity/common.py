"""What every differential run shares, whatever the vLLM version: the
divergence it raises, the views both pools are read through, its tally, the
choice of the next operation, and the command line and summary of a script.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NoReturn


class Divergence(AssertionError):
    pass


def require_vllm(script: str) -> None:
    """Exit with a message naming the env to use when vLLM is not importable."""
    try:
        import vllm  # noqa: F401
    except ImportError as exc:  # pragma: no cover - needs the vLLM venv
        raise SystemExit(
            f"{script}: vLLM 0.16.0 is not importable ({exc}); run with /tmp/vllm016/bin/python"
        ) from exc


def quiet_logging() -> None:
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("blockpool").setLevel(logging.ERROR)


# ------------------------------------------------------------------ views


def queue_ids(pool: Any) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def map_view(pool: Any, *, exact: bool = True) -> dict[Any, Any]:
    """The hash map, key -> block ids.  ``exact``: the ids in the entry's own
    order and whether the entry is a single block or a dict; otherwise the
    ids sorted."""
    out: dict[Any, Any] = {}
    for key, entry in pool.cached_block_hash_to_block._cache.items():
        if not exact:
            out[key] = sorted(entry) if isinstance(entry, dict) else [entry.block_id]
        elif isinstance(entry, dict):
            out[key] = ("dict", list(entry))
        else:
            out[key] = ("one", [entry.block_id])
    return out


def event_view(ev: Any) -> tuple[Any, ...]:
    """An event's type and every field."""
    fields = ev.__struct_fields__
    return (type(ev).__name__, fields, tuple(getattr(ev, f) for f in fields))


# ------------------------------------------------------------------ a run


@dataclass
class RunStats:
    ops: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    events: int = 0
    samples: int = 0
    hits: int = 0
    errors_matched: int = 0

    def bump(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def add(self, other: RunStats, *, counts: bool = True) -> None:
        """Add ``other``'s sums in (and its operation counts, with ``counts``)."""
        for f in fields(self):
            if f.name != "counts":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        if counts:
            for k, v in other.counts.items():
                self.bump(k, v)


# (bound, name, action): the first entry whose bound the draw is under runs;
# a bound of 1 always takes the draw, 0 never does.
OpTable = Sequence[tuple[float, str, Callable[[], Any]]]


class Run:
    """One seeded run of one configuration: its tally, the operation in hand,
    and the checks every driver makes of its two pools."""

    def __init__(self, name: str, seed: int) -> None:
        self.name, self.seed = name, seed
        self.stats = RunStats()
        self.op = "start"

    def fail(self, msg: str) -> NoReturn:
        raise Divergence(f"[{self.name}, seed {self.seed}, op {self.stats.ops} {self.op}] {msg}")

    def perform(self, x: float, table: OpTable) -> None:
        """Run the operation the draw ``x`` picks from ``table``."""
        for bound, name, action in table:
            if x < bound:
                self.op = name
                action()
                return
        raise ValueError(f"no operation for the draw {x}")

    def same_free_queue(self, v: Any, o: Any) -> None:
        if queue_ids(v) != queue_ids(o):
            self.fail(f"free queue: vllm {queue_ids(v)} ours {queue_ids(o)}")

    def same_hash_map(self, v: Any, o: Any, *, exact: bool = True) -> None:
        if map_view(v, exact=exact) != map_view(o, exact=exact):
            self.fail("hash map contents differ")

    def same_pool_state(self, v: Any, o: Any) -> None:
        """The free queue order, every block's ref count and hash, and the
        hash map."""
        self.same_free_queue(v, o)
        if [(b.ref_cnt, b.block_hash) for b in v.blocks] != [
            (b.ref_cnt, b.block_hash) for b in o.blocks
        ]:
            self.fail("ref counts or hashes differ")
        self.same_hash_map(v, o)

    def same_taken_events(
        self, v: Any, o: Any, view: Callable[[Any], Any] = event_view, shown: int = 3
    ) -> int:
        """Take both pools' events: they must read the same.  Returns how many."""
        ve = [view(e) for e in v.take_events()]
        oe = [view(e) for e in o.take_events()]
        if ve != oe:
            self.fail(f"events differ: vllm {ve[:shown]} ours {oe[:shown]}")
        return len(ve)


# ------------------------------------------------------------ the script


def parse_args(
    doc: str | None, argv: Sequence[str] | None, *, seeds: int, ops: int
) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, default=seeds, help="seeds per configuration")
    p.add_argument("--ops", type=int, default=ops, help="operations per run")
    p.add_argument("--first-seed", type=int, default=1)
    return p.parse_args(argv)


def seed_range(args: argparse.Namespace) -> range:
    return range(args.first_seed, args.first_seed + args.seeds)


@dataclass
class Totals:
    """The sums over every run of a script (``sums``: the runs' stats added)."""

    runs: int = 0
    failures: int = 0
    sums: RunStats = field(default_factory=RunStats)
    started: float = field(default_factory=time.perf_counter)

    def play(
        self, make: Callable[[Any, int], Any], cfg: Any, seed: int, ops: int, *, counts: bool = True
    ) -> RunStats | None:
        """``make(cfg, seed).run(ops)``, added in; a divergence is printed
        and counted, and gives None.  ``counts``: add the run's operation
        counts to those the summary lists."""
        self.runs += 1
        try:
            st: RunStats = make(cfg, seed).run(ops)
        except Divergence as e:
            self.failures += 1
            print(f"DIVERGENCE {e}", flush=True)
            return None
        self.sums.add(st, counts=counts)
        return st

    def play_each(
        self,
        make: Callable[[Any, int], Any],
        configs: Sequence[Any],
        seeds: range,
        ops: int,
        line: Callable[[RunStats], str],
        *,
        counts: bool = True,
        width: int = 24,
    ) -> None:
        """``play`` every configuration for every seed, one line a run that
        matched: ``ok``, its name and seed, ``line(stats)`` and its time."""
        for cfg in configs:
            for seed in seeds:
                t = time.perf_counter()
                st = self.play(make, cfg, seed, ops, counts=counts)
                if st is not None:
                    print(
                        f"  ok  {cfg.name:<{width}} seed {seed}: {line(st)} ({since(t)})",
                        flush=True,
                    )

    def exercised(self) -> str:
        return "operations exercised: " + ", ".join(
            f"{k} {v}" for k, v in sorted(self.sums.counts.items())
        )

    def verdict(self, ok: str, *, diverged: str = "diverged") -> int:
        """Print the last line; the exit status."""
        if self.failures:
            print(f"FAILED: {self.failures} run(s) {diverged}")
            return 1
        print(f"OK: {ok}")
        return 0


def since(t: float) -> str:
    """Seconds since ``t`` (a ``time.perf_counter()``), as the lines print them."""
    return f"{time.perf_counter() - t:.1f}s"
