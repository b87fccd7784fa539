"""Shared test setup: Hypothesis profiles, a fixed NONE_HASH, state snapshots.

Profiles (select with ``--hypothesis-profile=NAME``):

* ``ci``  -- derandomized, no example database, enough examples that the
  stateful pool test runs well over 10,000 state-machine steps in total.
* ``dev`` -- the default: fewer examples, random seeds, quick to iterate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import blockpool
from blockpool import BlockPool

# The stateful test runs max_examples * stateful_step_count steps (Hypothesis
# almost never stops a run early); tests/blockpool/test_stateful.py checks the
# count it actually ran.
settings.register_profile(
    "ci",
    max_examples=300,
    stateful_step_count=60,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev",
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("dev")

# Hashes must not depend on PYTHONHASHSEED or on os.urandom: fix NONE_HASH at
# import (modules that hash at import time see it too) and per session.
FIXED_SEED = "0"
blockpool.init_none_hash(blockpool.sha256, seed=FIXED_SEED)


@pytest.fixture(autouse=True, scope="session")
def _fixed_none_hash() -> None:
    blockpool.init_none_hash(blockpool.sha256, seed=FIXED_SEED)


@pytest.fixture
def restore_hash_settings() -> Any:
    """For tests that change NONE_HASH or the event hash form: put both back."""
    yield
    blockpool.init_none_hash(blockpool.sha256, seed=FIXED_SEED)
    blockpool.set_int_block_hashes(True)


def queue_ids(pool: BlockPool) -> list[int]:
    """The free queue, head (next to be reused) first, as block ids."""
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def map_contents(pool: BlockPool) -> dict[bytes, tuple[str, list[int]]]:
    """The hash map as key -> ("one" | "dict", block ids in insertion order)."""
    out: dict[bytes, tuple[str, list[int]]] = {}
    for key, entry in pool.cached_block_hash_to_block._cache.items():
        if isinstance(entry, dict):
            out[key] = ("dict", list(entry))
        else:
            out[key] = ("one", [entry.block_id])
    return out


def pool_state(pool: BlockPool) -> dict[str, Any]:
    """Everything observable about a pool, for "nothing changed" comparisons."""
    mc = pool.metrics_collector
    return {
        "blocks": [(b.block_id, b.ref_cnt, b.block_hash, b.is_null, id(b)) for b in pool.blocks],
        "queue": queue_ids(pool),
        "num_free": pool.get_num_free_blocks(),
        "map": map_contents(pool),
        "map_obj": id(pool.cached_block_hash_to_block),
        "events": list(pool.kv_event_queue),
        "metrics": None
        if mc is None
        else (
            {
                bid: (s.birth_time_ns, s.last_access_ns, tuple(s.access_history))
                for bid, s in mc.block_metrics.items()
            },
            list(mc._eviction_events),
        ),
    }


@pytest.fixture
def snapshot() -> Callable[[BlockPool], dict[str, Any]]:
    return pool_state


@pytest.fixture
def qids() -> Callable[[BlockPool], list[int]]:
    return queue_ids


@pytest.fixture
def mapped() -> Callable[[BlockPool], dict[bytes, tuple[str, list[int]]]]:
    return map_contents
