"""vLLM 0.16's scheduler, simulated: timed replays with arrivals and decode.

``scheduler.py`` (the v1 ``Scheduler``) over a slot backend: ``slots.py``
(one full-attention group on a ``BlockPool``), ``group_slots.py`` (several
KV-cache groups), ``runtime_slots.py`` (a ``PoolRuntime``'s operations, the
service's live replay); ``engine_core.py`` (the engine core's step loop on
simulated time, and the step-time model); ``scheduled.py`` and ``timed.py``
(timed mode at many capacities).
"""
