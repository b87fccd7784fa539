"""A served app let go of once stopped (a mirror's service rebuilt in the
same process for an engine restarted as another pool).

FastAPI remembers what each endpoint and dependency is (a coroutine, a
generator...) in module-level LRU caches of 4,096 callables, keyed by the
callables themselves.  A stopped app's route closures -- and through them
its engine and its pool -- stay alive until 4,096 other callables push them
out: each rebuild kept the last service's whole pool (measured: the engine
of an app stopped and dropped still alive after a full collection, held by
``fastapi.dependencies.models``' caches).
"""

from __future__ import annotations

import gc

# FastAPI's caches of callables (fastapi/dependencies/models.py); any one
# missing from a later FastAPI is skipped
FASTAPI_CALLABLE_CACHES = (
    "_is_gen_callable_cached",
    "_is_async_gen_callable_cached",
    "_is_coroutine_callable_cached",
)


def forget_served_app() -> int:
    """Clear FastAPI's caches of callables (they refill at the next app's
    first requests) and collect: what the dropped app held is freed.
    Returns the caches cleared."""
    try:
        from fastapi.dependencies import models
    except ImportError:  # pragma: no cover - FastAPI is a dependency of the service
        return 0
    cleared = 0
    for name in FASTAPI_CALLABLE_CACHES:
        clear = getattr(getattr(models, name, None), "cache_clear", None)
        if callable(clear):
            clear()
            cleared += 1
    gc.collect()
    return cleared
