"""Every response shape, declared once: the pydantic models the routes
declare (``/docs``, ``/openapi.json``) are what the builders here return.

One module per family: summary (config, tokens, the summary), inspect
(blocks, queue, hash map, logs), requests (requests, verify, demo),
operations (what the pool's and the requests' operations return), and
analysis, operator, trace, stream.  Long lists hold ``TypedDict`` items
(plain dicts, no object per item) in a ``model_construct``-ed model.
"""
