"""The workload: a trace file read and validated (Mooncake JSON lines, the
service's recordings, a mirror's traffic), and its prompts' block keys.

``reader.py`` tells a file apart; ``requests.py`` (``Trace``), ``limits.py``
(``TraceLimits``, ``TraceError``, line reading), ``mooncake.py``,
``recording.py``, ``traffic.py`` (the formats); ``keys.py`` (block
identities without hashing, and the real block hashes).
"""
