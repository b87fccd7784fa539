"""Every response shape, declared once: the pydantic models the routes
declare (``/docs``, ``/openapi.json``), and the models the handlers return.

summary, inspect, logs, requests hold the models and the views that build
them; long lists hold ``TypedDict`` items (plain dicts, no object per item)
in a ``model_construct``-ed model.  operator, trace, stream are built where
their data lives (request_story.py, trace/driver.py, stream/ws.py).

The operations' results are the library's ``TypedDict``s, declared next to
each handler (blockpool/runtime/ops/), which the routes declare and return
as built (``AsBuilt[...]``, app/api/declare.py); operations holds
``/batch``'s own.  The analysis' are the library's too, returned as built:
Misses (blockpool.analysis.views; a mirror's EngineMisses.view lays the
engine's MissCounts over it), HistoryState, HistoryDiff
(blockpool.analysis.moments), and, where the schema declares defaults, a
stdlib dataclass: History (blockpool.analysis.recording), ExportSize
(export_size.py).  analysis' RequestMisses and Regret extend the shapes
blockpool.analysis.views builds (RequestMissesView, RegretView) with what
the service adds.

Still a dict beside its model:
- Shadows (analysis.py): its schema declares defaults (``shadows: []``,
  ``curve: {}``), which a ``TypedDict`` cannot, and the response leaves keys
  out (the feeder's figures without shadows, ``fed`` off a mirror), which a
  dataclass, sending every field, cannot;
- the demo's status (requests.DemoStatus): its schema says ``mix`` holds
  integers, but the demo keeps (and sends) the weights DemoConfig gives it,
  floats: a shape mypy checks against the builder would say ``number``, and
  building the model would turn ``4.0`` into ``4`` (and refuse ``0.5``).
"""
