"""Planning on a trace: a replay in either mode at many capacities as one
report (``report.py``), and capacity planning on sequence replays -- dense
sweeps, other policies, the smallest pool for a hit rate (``planner.py``).

Above ``replay/`` and ``sched/``: it picks which of them answers.
"""
