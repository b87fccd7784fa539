"""The name and version of a mirror's traffic as a trace (written by
``blockpool/mirror/traffic.py``, read by ``blockpool/trace/workload/traffic.py``)
and the field a recording's request rows carry it in.

A traffic file is JSON lines: a header, then one Mooncake row a request
in arrival order::

    {"type": "header", "format": "blockpool-mirror-trace", "version": 1,
     "tokens_per_id": 16, "engine": {...}, "requests": N, ...}
    {"timestamp": 0.0, "input_length": 40, "output_length": 7,
     "hash_ids": [0, 1, 2], "hit_tokens": 0}

``tokens_per_id`` is the engine's block size: one hash id per block, the
same id for the same block hash (ids are numbered in first-seen order
within one file); the prompt's last, partial block gets an id of its own.
No token ids, no request ids: what the engine's plugin sends (hashes and
lengths), nothing more.
"""

from __future__ import annotations

from typing import Final

TRAFFIC_FORMAT: Final = "blockpool-mirror-trace"
TRAFFIC_VERSION: Final = 1
# a recording's line holding one mirrored request (the same row as above)
REQUEST_ROW: Final = "request"
