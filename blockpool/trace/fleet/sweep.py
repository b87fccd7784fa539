"""A sweep: many fleet configurations, each an independent simulation.

:func:`run_sweep` runs the jobs in this process (``serial``), on local
processes (``process``: ``concurrent.futures.ProcessPoolExecutor``, the
trace sent once to each worker; one worker, or one job, runs in this
process: no process to start) or as Ray tasks (``ray``: the trace put in
Ray's object store once, one task a job; Ray is imported only here and only
when asked).  Every executor returns the results in the jobs' order, equal
to the serial run's (a job is a pure function of the trace, the spec and
itself).

Ray: ``ray_address=None`` or ``"local"`` starts a Ray instance on this
machine with ``workers`` CPUs (loopback only, no dashboard); any other
address (``"ray://head:10001"``, ``"head:6379"``, ``"auto"``) joins that
cluster and ships this ``blockpool`` package to its workers
(``runtime_env={"py_modules": [blockpool]}``), so the cluster needs only
Ray and the library's own dependencies; joining needs what Ray itself
needs to join (its token authentication, on by default in recent Ray, is
set up in the operator's environment as Ray documents it).  Only the local
Ray is exercised by the suite.  A Ray already initialised in this process
is used as it is.
"""

from __future__ import annotations

import multiprocessing
import os
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Literal

from blockpool.trace.fleet.fleet import FleetSpec, run_job
from blockpool.trace.fleet.results import FleetJob, FleetResult
from blockpool.trace.workload.reader import Trace

Executor = Literal["process", "serial", "ray"]
EXECUTORS: tuple[str, ...] = typing.get_args(Executor)

_WORKER_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = trace


def _worker_job(spec: FleetSpec, job: FleetJob) -> FleetResult:
    assert _WORKER_TRACE is not None
    return run_job(_WORKER_TRACE, spec, job)


def default_workers() -> int:
    return max(1, os.cpu_count() or 1)


def run_sweep(
    trace: Trace,
    spec: FleetSpec,
    jobs: Sequence[FleetJob],
    *,
    executor: str = "process",
    workers: int | None = None,
    ray_address: str | None = None,
    done: Callable[[int, int], None] | None = None,
) -> list[FleetResult]:
    """Every job's result, in the jobs' order; ``done(finished, total)`` after each."""
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ValueError(f"workers must be >= 1, got {workers!r}")
    if not jobs:
        return []
    total = len(jobs)
    if executor == "serial" or (executor == "process" and (workers == 1 or total == 1)):
        out = []
        for k, job in enumerate(jobs):
            out.append(run_job(trace, spec, job))
            if done is not None:
                done(k + 1, total)
        return out
    n = min(workers or default_workers(), total)
    if executor == "process":
        return _processes(trace, spec, jobs, n, done)
    return _ray(trace, spec, jobs, n, ray_address, done)


def _processes(
    trace: Trace,
    spec: FleetSpec,
    jobs: Sequence[FleetJob],
    n: int,
    done: Callable[[int, int], None] | None,
) -> list[FleetResult]:
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded parent
    results: list[FleetResult | None] = [None] * len(jobs)
    with ProcessPoolExecutor(n, mp_context=ctx, initializer=_init_worker, initargs=(trace,)) as ex:
        futures = {ex.submit(_worker_job, spec, job): k for k, job in enumerate(jobs)}

        for finished, fut in enumerate(as_completed(futures), 1):
            results[futures[fut]] = fut.result()
            if done is not None:
                done(finished, len(jobs))
    return [r for r in results if r is not None]


def _ray_job(trace: Trace, spec: FleetSpec, job: FleetJob) -> FleetResult:
    return run_job(trace, spec, job)


def _ray(
    trace: Trace,
    spec: FleetSpec,
    jobs: Sequence[FleetJob],
    n: int,
    address: str | None,
    done: Callable[[int, int], None] | None,
) -> list[FleetResult]:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "--executor ray needs Ray: pip install 'blockpool[ray]' (or pip install ray)"
        ) from None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address in (None, "local"):
            kwargs.update(address="local", num_cpus=n, _node_ip_address="127.0.0.1")
        else:
            import blockpool

            kwargs.update(address=address, runtime_env={"py_modules": [blockpool]})
            kwargs.pop("include_dashboard")
        ray.init(**kwargs)
    task = ray.remote(num_cpus=1)(_ray_job)
    trace_ref = ray.put(trace)
    refs = [task.remote(trace_ref, spec, job) for job in jobs]
    index = {ref: k for k, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    waiting = list(refs)
    finished = 0
    while waiting:
        ready, waiting = ray.wait(waiting, num_returns=1)
        for ref in ready:
            results[index[ref]] = ray.get(ref)
            finished += 1
            if done is not None:
                done(finished, len(refs))
    return results
