"""A GPU-sized vLLM scheduler without a GPU: what the blockpool plugin costs it
(bench/gpu_scale/run.py)."""
