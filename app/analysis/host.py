"""The service's analysis: the library's Analysis on the engine (``inline``), or
on a replica in a worker process (``worker``, the default), plus the recording.

* ``inline``: the engine's runtime calls the library ``Analysis``'s hooks
  (blockpool/runtime/observer.py); exact and synchronous; it costs the engine
  ~25% of its throughput on an eviction-heavy load (bench/bench_analysis.py).
* ``worker`` (needs the recording): the engine only records; a live replica
  in the worker process runs the same hooks (``remote.py``).

Either way the recording (time travel) lives with the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.analysis import prom
from app.analysis.remote import RemoteAnalysis
from app.analysis.shadows import MirrorShadows, ShadowLayout, make_feeder, shadow_specs
from app.analysis.worker import pool_view
from blockpool.analysis import views
from blockpool.analysis.core import Analysis
from blockpool.analysis.recording import Recorder
from blockpool.runtime.observer import OpObserver

if TYPE_CHECKING:
    from app.shared.settings import Settings
    from blockpool.analysis.engine_misses import EngineMisses
    from blockpool.runtime.runtime import PoolRuntime


class PoolJumps(OpObserver):
    """Worker mode: what the engine's runtime tells the analysis -- only that
    its pool jumped to another pool's state (a mirror's resync): the replica
    is sent the new state (``RemoteAnalysis.pool_jumped``)."""

    def __init__(self, remote: RemoteAnalysis) -> None:
        self.remote = remote

    def on_resync(self) -> None:
        self.remote.pool_jumped()


class AnalysisHost:
    def __init__(
        self, engine: PoolRuntime, settings: Settings, clock: Callable[[], float] = time.time
    ) -> None:
        s = settings
        self.engine = engine
        self.clock = clock  # wall time (tests inject one)
        self.local = s.analysis_mode == "inline" or not s.recording
        self.recorder: Recorder | None = None
        if s.recording:
            self.recorder = Recorder(
                engine,
                s.recording_max_ops,
                s.recording_max_bytes,
                s.recording_keyframe_ops,
                clock=lambda: self.clock(),
            )
        self.inline: Analysis | None = None
        self.remote: RemoteAnalysis | None = None
        if self.local:
            feeder = None
            if s.shadow_mode != "off" and s.enable_caching:
                specs = shadow_specs(list(s.shadow_policies), list(s.shadow_factors), s.shadow_grid)
                layout = ShadowLayout(
                    specs, engine.pool.num_gpu_blocks - 1, s.block_size, s.num_groups
                )
                feeder = make_feeder(layout, s.shadow_mode, s.shadow_max_lag)
            self.inline = Analysis(
                engine,
                miss_index_size=s.miss_index_size,
                miss_finished_kept=s.miss_finished_kept,
                feeder=feeder,
                recorder=self.recorder,
                clock=lambda: self.clock(),
            )
        else:
            assert self.recorder is not None
            opening = {
                "runtime": engine.config.as_dict(),
                "miss_index_size": s.miss_index_size,
                "miss_finished_kept": s.miss_finished_kept,
                "shadows": None
                if s.shadow_mode == "off"
                else {
                    "policies": list(s.shadow_policies),
                    "factors": list(s.shadow_factors),
                    "grid": s.shadow_grid,
                },
            }
            self.remote = RemoteAnalysis(engine, opening, self.recorder, s.shadow_max_lag)
        self.tick_seconds = 0.0
        # a mirror of a real engine: its requests' miss reasons are the tally
        # the stream and GET /api/misses show (``show_engine_misses``)
        self.engine_misses: EngineMisses | None = None
        # ... and its what-if: shadows fed from the engine's requests
        self.mirror_shadows: MirrorShadows | None = None

    @property
    def observer(self) -> OpObserver:
        """What the engine's runtime tells of every change (``PoolRuntime.observe``)."""
        if self.inline is not None:
            return self.inline
        assert self.remote is not None
        return PoolJumps(self.remote)

    def show_engine_misses(self, misses: EngineMisses) -> None:
        """A mirror's: the engine's requests' miss reasons are the ones shown."""
        self.engine_misses = misses

    def show_mirror_shadows(self, shadows: MirrorShadows) -> None:
        """A mirror's: the what-if shown is the one fed from the engine's
        requests (started and stopped with the analysis)."""
        self.mirror_shadows = shadows

    # the inline analysis' parts (tests, views)
    @property
    def misses(self) -> Any:
        return self.inline.misses if self.inline is not None else None

    @property
    def feeder(self) -> Any:
        return self.inline.feeder if self.inline is not None else None

    # ---------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.inline is not None:
            self.inline.start()
        if self.remote is not None:
            self.remote.start()
        if self.mirror_shadows is not None:
            self.mirror_shadows.start()

    def stop(self) -> None:
        if self.inline is not None:
            self.inline.stop()
        if self.remote is not None:
            self.remote.stop()
        if self.mirror_shadows is not None:
            self.mirror_shadows.stop()

    def on_tick(self) -> None:
        t0 = time.perf_counter()
        if self.mirror_shadows is not None:
            self.mirror_shadows.flush(self.engine.manager.stats)
        if self.inline is not None:
            self.inline.on_tick()
        if self.recorder is not None:
            self.recorder.maybe_keyframe()
        if self.remote is not None:
            self.remote.flush()
        self.tick_seconds += time.perf_counter() - t0

    # ------------------------------------------------- answers, either mode

    async def query(self, kind: str, **args: Any) -> dict[str, Any]:
        """A view: ``misses``, ``request_misses``, ``regret``, ``shadows`` or
        ``pool`` (the analysed pool's digest)."""
        result: dict[str, Any]
        if kind == "shadows" and self.mirror_shadows is not None:
            result = self.mirror_shadows.view(self.engine.manager.stats)
            result["worker"] = None
        elif self.remote is not None:
            result = await self.remote.query(kind, **args)
            result["worker"] = self.remote.snapshot()  # how far behind the answer may be
        else:
            assert self.inline is not None
            if kind == "pool":
                result = pool_view(self.engine)
            else:
                result = views.VIEWS[kind](self.inline, **args)
            result["worker"] = None
        if kind == "misses" and self.engine_misses is not None:
            result.update(self.engine_misses.view())
        return result

    def stream_section(self) -> dict[str, Any] | None:
        if self.remote is not None:
            if self.remote.stream is None:
                return None
            r = self.remote.snapshot()
            worker = {"lag_ops": r["lag_ops"], "resyncs": r["resyncs"], "error": r["error"]}
            sec = {**self.remote.stream, "worker": worker}
        else:
            assert self.inline is not None
            sec = {**views.stream_section(self.inline), "worker": None}
        if self.engine_misses is not None:
            sec.update(self.engine_misses.section())
        ms = self.mirror_shadows
        if ms is not None:
            f = ms.feeder
            sec["shadows"] = ms.stream_rows()
            sec["shadow_lag"] = f.outstanding + len(f.pending)
            sec["shadow_error"] = f.error
            sec["shadow_fed"] = ms.feed.fed_text()
        return sec

    def prom_state(self) -> dict[str, Any] | None:
        if self.remote is not None:
            st = self.remote.prom
        else:
            assert self.inline is not None
            st = prom.state(self.inline)
        em = self.engine_misses
        if st is None or em is None:
            return st
        # a mirror: the engine's requests' miss reasons, as the page shows them
        return {**st, "blocks": list(em.blocks), "tokens": list(em.tokens)}

    def block_reasons(self, rid: str) -> list[tuple[str | None, dict[str, Any] | None]]:
        if self.remote is not None:
            packed = self.remote.reasons.get(rid)
            return views.unpack_reasons(packed) if packed is not None else []
        assert self.inline is not None
        return views.block_reasons(self.inline, rid)

    def rates(self) -> dict[str, float]:
        if self.inline is not None:
            return self.inline.rates()
        return {"regrets_per_s": 0.0, "evictions_per_s": 0.0, "window_s": 0.0}
