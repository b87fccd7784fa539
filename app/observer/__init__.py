"""``blockpool observe``: the observer service.  Subscribes to one or many real
vLLM (or SGLang, or blockpool) KV-event streams and serves a fleet dashboard
rebuilt from the events alone (``app.observer.app:create_observer_app``).
The codec, the sequence tracker and the per-instance state are the library's
(``blockpool.kvevents``)."""
