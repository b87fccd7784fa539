"""What a measured engine step records (bench/gpu_scale/engine.py's driver
fills them): the step's times, one entry a step (``Steps``), and the
garbage collector's collections and their time (``GcClock``)."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field


class GcClock:
    """Collections and their time, by generation, through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.ns = [0, 0, 0]
        self.max_ns = [0, 0, 0]
        self.in_step_ns = 0  # reset by the driver at each step
        self._t = 0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter_ns()
            return
        d = time.perf_counter_ns() - self._t
        g = int(info.get("generation", 0))
        self.count[g] += 1
        self.ns[g] += d
        self.max_ns[g] = max(self.max_ns[g], d)
        self.in_step_ns += d

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, list[int]]:
        return {"collections": list(self.count), "ns": list(self.ns), "max_ns": list(self.max_ns)}


@dataclass
class Steps:
    """Per measured step, one entry each."""

    sched_ns: list[int] = field(default_factory=list)  # add_request + schedule + update
    schedule_ns: list[int] = field(default_factory=list)
    update_ns: list[int] = field(default_factory=list)
    add_ns: list[int] = field(default_factory=list)
    step_ns: list[int] = field(default_factory=list)  # the whole step, wall clock
    gc_ns: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # tokens scheduled
    # how late the engine's thread came back from waiting for a forward pass
    # (the interpreter held by another thread when it was done): 0 when it
    # did not wait
    late_ns: list[int] = field(default_factory=list)
    # the engine thread's CPU time in add_request + schedule + update
    # (thread_time: not the time it waited for the interpreter or the CPU)
    sched_cpu_ns: list[int] = field(default_factory=list)
