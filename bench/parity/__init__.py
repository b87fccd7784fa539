"""Differential checks of blockpool against vLLM's own pool, call for call.

The entry points are bench/compare_vllm.py (vLLM 0.16.0: its BlockPool and
its KVCacheManager) and bench/compare_vllm_current.py (vLLM 0.33.0's
BlockPool against our ``free_order="uncached_first"``).  This package holds
what they run:

- ``common``: what every run shares, whatever the vLLM version (the
  divergence, the views both pools are read through, the tally, the
  command line and the summary);
- ``pool016_pair``, ``pool016_requests``, ``pool016``: vLLM 0.16.0's
  BlockPool and ours (the two sides and their comparison, the request
  traffic, the other pool calls and the run);
- ``manager016``: vLLM 0.16.0's KVCacheManager against our RequestManager;
- ``pool033``: vLLM 0.33.0's BlockPool against ours.

Importing the package puts the checkout first on ``sys.path`` (so that
``blockpool`` is this one) and keeps vLLM's log quiet.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
