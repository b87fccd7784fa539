"""Every response shape, declared once: the pydantic models the routes
declare (``/docs``, ``/openapi.json``), and the models the handlers return.

summary, inspect, logs, requests hold the models and the views that build
them; long lists hold ``TypedDict`` items (plain dicts, no object per item)
in a ``model_construct``-ed model.  operator, trace, stream are built where
their data lives (request_story.py, trace/driver.py, stream/ws.py).

The operations' results are the library's ``TypedDict``s, declared next to
each handler (blockpool/runtime/ops/), which the routes declare and return
as built (``AsBuilt[...]``, app/api/declare.py); operations holds
``/batch``'s own.  analysis' RequestMisses and Regret extend the shapes
blockpool.analysis.views builds (RequestMissesView, RegretView) with what
the service adds.  Still plain dicts beside their model: the rest of
analysis (Misses, Shadows, History, HistoryState, HistoryDiff, ExportSize)
and the demo's status.
"""
