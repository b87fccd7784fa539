"""Sequence replays on the pool: requests one at a time, prompt blocks only.

``results.py`` (capacities and what a replay found at each, shared by every
replay), ``sequence.py`` (one real pool per capacity), ``sequence_groups.py``
(over sliding-window and hybrid KV-cache groups), ``curve.py`` (the whole
hit-rate curve in one pass), ``optimal.py`` (the offline optimum).
"""
