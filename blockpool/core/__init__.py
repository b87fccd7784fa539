"""vLLM 0.16.0's block pool and request manager (docs/spec.md): the core every
other layer of the library is built on.
"""
