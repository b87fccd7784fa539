"""The pool service: the engine that drives the runtime, its request bodies,
views, workloads and metrics.
"""
