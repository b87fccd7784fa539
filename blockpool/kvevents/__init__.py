"""vLLM's KV-event stream, as a library (the ``kvevents`` extra: pyzmq).

* ``decode`` -- the wire codec a subscriber needs: both encodings vLLM and its
  peers send (vLLM 0.16's positional arrays, the map-tagged form of newer vLLM
  and SGLang), bounded against poison messages (``poison``, ``extra``).
* ``wire_format`` -- the map-tagged encoding the publisher can send.
* ``publisher`` -- publish KV events over ZMQ exactly as vLLM 0.16 does (PUB
  topic / 8-byte seq / msgpack KVEventBatch; ROUTER replay), from a thread.
* ``tracker`` and ``state`` -- a subscriber's synchronous core: sequence gaps,
  replay gap-fill, and the hash map per group rebuilt from the events.
* ``config`` -- endpoints, bind-or-connect, data-parallel ports.

The asyncio socket loop of the subscriber and the fleet view are the
service's (``app/observer/``).  Nothing here imports vLLM; the wire form is
written from vLLM's documented behaviour and checked against its real classes
by ``bench/check_vllm_kvevents.py`` (a manual check, not part of the tests).
Importing this package needs no zmq; ``publisher`` does.
"""
