"""The two production-trace benchmarks of bench/bench_trace.py: ``curve``
(the hit-rate curve against vLLM 0.16.0's pool) and ``requests`` (RequestManager against vLLM
0.16.0's KVCacheManager).  Importing the package puts this checkout first on
``sys.path`` and sets the environment both need before vLLM is imported."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PYTHONHASHSEED", "0")
