"""vLLM's KV-event stream, both ways.

* ``publisher`` -- publish the engine's KV events over ZMQ exactly as vLLM 0.16
  does (PUB topic / 8-byte seq / msgpack KVEventBatch; ROUTER replay).
* ``observer_app`` -- ``blockpool observe``: subscribe to one or many real vLLM
  (or SGLang, or blockpool) streams and serve a fleet dashboard rebuilt from
  the events alone.

Nothing here imports vLLM; the wire form is written from vLLM's documented
behaviour and checked against its real classes by
``bench/check_vllm_kvevents.py`` (a manual check, not part of the tests).
"""
