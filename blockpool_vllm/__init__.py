"""Follow a running vLLM engine's KV-cache block pool for ``blockpool serve --mirror``.

The engine side of the mirror, shipped in blockpool's wheel (extra ``vllm``):
``blockpool_vllm.scheduler.MirrorScheduler`` is vLLM's scheduler plus a
follower of its block pool (``follower.py``) and a sender thread
(``sender.py``).  Nothing here runs unless vLLM is started with
``--scheduler-cls blockpool_vllm.scheduler.MirrorScheduler`` and
``BLOCKPOOL_MIRROR_ENDPOINT`` is set.  Importing this package imports no vLLM.
"""

from __future__ import annotations
