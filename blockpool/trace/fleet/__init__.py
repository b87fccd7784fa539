"""Fleet planning: a trace routed to N replicas, each an exact pool of its own.

``routers.py`` (round_robin, session, least_loaded, prefix_aware),
``sequence.py`` / ``timed.py`` (the replays, both built from a ``setup.py``
FleetSetup), ``fleet.py`` (one configuration), ``sweep.py`` (many, serial /
on processes / on Ray),
``targets.py`` (the smallest fleet meeting a target), ``stepfit.py`` (a step
model fitted from a vLLM ``/metrics`` scrape).
"""

from blockpool.trace.fleet.fleet import FleetSpec, run_job
from blockpool.trace.fleet.results import FleetJob, FleetResult
from blockpool.trace.fleet.routers import ROUTERS, make_router, parse_routers
from blockpool.trace.fleet.sweep import EXECUTORS, run_sweep

__all__ = [
    "EXECUTORS",
    "ROUTERS",
    "FleetJob",
    "FleetResult",
    "FleetSpec",
    "make_router",
    "parse_routers",
    "run_job",
    "run_sweep",
]
