"""The ``max_model_len`` vLLM 0.16.0 derives from a Hugging Face config when
none is given (``config/model.py``: ``_get_and_verify_max_len``).

* the smallest of the length keys the text config has
  (``model_arch_config_convertor.py``: ``derive_max_model_len_and_key``:
  ``max_position_embeddings``, ``n_positions``, ``max_seq_len``,
  ``seq_length``, ``model_max_length``, ``max_target_positions``,
  ``max_sequence_length``, ``max_seq_length``, ``seq_len``), and
  ``model_max_length`` instead when it is set; 2048 when there is none;
* ``--disable-sliding-window`` caps it at the window when the window is
  shorter;
* then RoPE scaling, except for Gemma 3 (whose length is already scaled): a
  ``rope_scaling`` whose ``rope_type`` (or legacy ``type``) is not ``su``,
  ``longrope`` or ``llama3`` multiplies it by its ``factor``, and ``yarn``
  first resets it to ``original_max_position_embeddings``; ``longrope``
  takes ``original_max_position_embeddings`` when the config has it.

A config class's own defaults count where the file leaves the key out:
GPT-OSS's ``rope_scaling`` (yarn, factor 32 of 4096 positions).
"""

from __future__ import annotations

from typing import Any

_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_ROPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt_oss": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096},
}


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        return None
    return float(v)


def derived_max_model_len(cfg: dict[str, Any], model_type: str, cap: int | None) -> int:
    """vLLM's default ``max_model_len`` for the text config ``cfg`` (``cap``: the
    window of ``--disable-sliding-window``)."""
    found = [n for n in (_number(cfg.get(k)) for k in _KEYS) if n is not None]
    derived = min(found) if found else 2048.0
    if (own := _number(cfg.get("model_max_length"))) is not None:
        derived = own
    if cap is not None and cap < derived:
        derived = float(cap)
    rope = cfg.get("rope_scaling", _ROPE_DEFAULTS.get(model_type))
    if isinstance(rope, dict) and "gemma3" not in model_type:
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in ("su", "longrope", "llama3"):
            factor = _number(rope.get("factor")) or 1.0
            if kind == "yarn":
                original = _number(rope.get("original_max_position_embeddings"))
                if original is None:
                    raise ValueError("model config: a yarn rope_scaling without its length")
                derived = original
            derived *= factor
        elif kind == "longrope" and (o := _number(cfg.get("original_max_position_embeddings"))):
            derived = o
    return int(derived)
