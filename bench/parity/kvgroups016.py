"""vLLM 0.16.0's own KV-cache groups and block counts for Hugging Face configs.

Run with the 0.16.0 venv; reads a JSON list of cases (``name``, ``config``,
``tp``, ``kv_cache_dtype``, ``block_size``, ``budgets``, ``disable_hybrid``,
``disable_sliding_window``) and prints, per case, what vLLM makes of it:

* vLLM's ``ModelConfig`` of the config (an offline hub cache written under
  ``--hf-home``; transformers 4.57's config class fills the defaults and
  ``layer_types``): KV heads per GPU, head size, dtype, ``max_model_len``;
* each layer's spec as the model code builds it: ``Attention.__init__`` takes
  the model's per-layer window, else ``CacheConfig.sliding_window``, which
  ``EngineArgs.create_engine_config`` sets to ``get_sliding_window()`` for a
  model that ``is_interleaved`` says is not interleaved; the per-layer
  window follows the architecture's file (``gemma2.py``, ``gemma3.py``,
  ``commandr.py``, ``llama.py`` (llama, mistral, phi3), ``exaone4.py``,
  ``olmo2.py`` (olmo3): ``layer_types[i] == "sliding_attention"``;
  ``gpt_oss.py``: even layers; ``qwen2.py``, ``qwen3_moe.py``,
  ``mixtral.py``, ``starcoder2.py``: none);
* ``get_kv_cache_groups`` of those ``FullAttentionSpec`` / ``SlidingWindowSpec``
  layers, ``get_kv_cache_config_from_groups`` at each budget, and the
  "GPU KV cache size: N tokens" that ``_report_kv_cache_config`` logs.

    VENV016/bin/python bench/parity/kvgroups016.py CASES.json --hf-home DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched016 import setup_offline, write_hf_cache

# architectures whose attention reads layer_types (the model files above)
_LAYER_TYPES = {
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",
    "Cohere2ForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",
    "Exaone4ForCausalLM",
    "Olmo2ForCausalLM",  # olmo3 loads as olmo2.py's class
}
_EVEN_LAYERS = {"GptOssForCausalLM"}


class _Tokens(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "GPU KV cache size: %s tokens":
            self.seen.append(int(str(record.args[0]).replace(",", "")))  # type: ignore[index]


def run(case: dict[str, Any], home: Path, handler: _Tokens) -> dict[str, Any]:
    from vllm import logger as vllm_logger
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.transformers_utils.config import is_interleaved
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    repo = f"blockpool/{case['name']}"
    write_hf_cache(home, repo, case["config"])
    model = ModelConfig(
        model=repo,
        skip_tokenizer_init=True,
        disable_sliding_window=case.get("disable_sliding_window", False),
    )
    parallel = ParallelConfig(tensor_parallel_size=case.get("tp", 1))
    text = model.hf_text_config
    cache_window = None if is_interleaved(text) else model.get_sliding_window()
    arch = model.architectures[0]
    kv_dtype = case.get("kv_cache_dtype", "auto")
    dtype = model.dtype if kv_dtype == "auto" else STR_DTYPE_TO_TORCH_DTYPE[kv_dtype]
    common = {
        "block_size": case.get("block_size", 16),
        "num_kv_heads": model.get_num_kv_heads(parallel),
        "head_size": model.get_head_size(),
        "dtype": dtype,
    }
    specs: dict[str, Any] = {}
    types = getattr(text, "layer_types", None)
    for i in range(text.num_hidden_layers):
        own = None
        if (arch in _LAYER_TYPES and types and types[i] == "sliding_attention") or (
            arch in _EVEN_LAYERS and i % 2 == 0
        ):
            own = text.sliding_window
        window = own if own is not None else cache_window
        name = f"model.layers.{i}.self_attn.attn"
        if window is None:
            specs[name] = FullAttentionSpec(**common)
        else:
            specs[name] = SlidingWindowSpec(**common, sliding_window=window)
    vcfg: Any = SimpleNamespace(
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=case.get("disable_hybrid", False),
            max_num_batched_tokens=8192,
        ),
        cache_config=SimpleNamespace(num_gpu_blocks_override=None),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        model_config=model,
    )
    groups = ku.get_kv_cache_groups(vcfg, specs)
    out: dict[str, Any] = {
        "name": case["name"],
        "groups": [
            [
                "sliding_window" if isinstance(g.kv_cache_spec, SlidingWindowSpec) else "full",
                getattr(g.kv_cache_spec, "sliding_window", None)
                if isinstance(g.kv_cache_spec, SlidingWindowSpec)
                else None,
                [int(n.split(".")[2]) for n in g.layer_names],
            ]
            for g in groups
        ],
        "page_size": groups[0].kv_cache_spec.page_size_bytes,
        "max_model_len": model.max_model_len,
        "num_blocks": [],
        "tokens": [],
    }
    for budget in case["budgets"]:
        kvc = ku.get_kv_cache_config_from_groups(vcfg, groups, budget)
        handler.seen.clear()
        vllm_logger._print_info_once.cache_clear()  # the same figure twice is logged twice
        ku._report_kv_cache_config(vcfg, kvc)
        out["num_blocks"].append(kvc.num_blocks)
        out["tokens"].append(handler.seen[-1] if handler.seen else None)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases")
    p.add_argument("--hf-home", required=True)
    args = p.parse_args(argv)
    home = Path(args.hf_home)
    setup_offline(str(home))
    logging.getLogger("vllm").setLevel(logging.ERROR)
    handler = _Tokens()
    kv_log = logging.getLogger("vllm.v1.core.kv_cache_utils")
    kv_log.setLevel(logging.INFO)
    kv_log.addHandler(handler)
    cases = json.loads(Path(args.cases).read_text())
    print(json.dumps([run(c, home, handler) for c in cases]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
