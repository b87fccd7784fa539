"""Replaying production traces (Mooncake JSON lines, the service's recordings)
on the pool: hit rate, evictions and miss reasons per capacity.

Pure library: no app imports, no environment reads, no asyncio.
"""

from blockpool.trace.replay.curve import OnePassCurve, one_pass_curve
from blockpool.trace.replay.results import CapacityResult, parse_capacities
from blockpool.trace.replay.sequence import SequenceDriver, make_pool, replay_pools
from blockpool.trace.workload.reader import (
    TOKENS_PER_ID,
    Trace,
    TraceError,
    TraceLimits,
    TraceRequest,
    parse_mooncake,
    parse_recording,
    parse_trace,
    read_trace,
)

__all__ = [
    "TOKENS_PER_ID",
    "CapacityResult",
    "OnePassCurve",
    "SequenceDriver",
    "Trace",
    "TraceError",
    "TraceLimits",
    "TraceRequest",
    "make_pool",
    "one_pass_curve",
    "parse_capacities",
    "parse_mooncake",
    "parse_recording",
    "parse_trace",
    "read_trace",
    "replay_pools",
]
