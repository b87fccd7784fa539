"""The engine's analysis: why prefixes missed, what evictions cost, what a
bigger cache or another free order would buy, and the pool at any recorded
moment.  See ``core.Analysis``; the library part (shadow pools and their
policies) is ``blockpool.shadow``.

Kept import-light: the shadow worker process imports ``app.analysis.worker``.
"""
