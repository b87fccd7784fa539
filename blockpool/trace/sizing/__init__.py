"""Pool sizes as vLLM 0.16.0 derives them from a model: each layer's
attention in a Hugging Face config (``hf_layers.py``), the KV-cache groups
(``kv_groups.py``), ``max_model_len`` (``model_len.py``), and bytes to
``num_gpu_blocks`` (``capacity.py``).
"""
