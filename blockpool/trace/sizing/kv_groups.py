"""vLLM 0.16.0's KV-cache groups of a model's layers
(``vllm/v1/core/kv_cache_utils.py``; line numbers of the 0.16.0 wheel).

``get_kv_cache_groups`` (l. 1210):

* with the hybrid manager disabled, ``unify_hybrid_kv_cache_specs`` (l. 1148)
  first turns every sliding-window and chunked-local layer into full
  attention when the model also has full-attention layers (a model whose
  layers all share one spec, such as all-sliding Mistral, keeps it); vLLM
  disables the manager itself (``config/vllm.py`` l. 1038-1101) on a
  platform without hybrid support, with ``--kv-events-config``, with
  ``--kv-transfer-config`` unless told otherwise, and for chunked local
  attention with EAGLE;
* layers of one spec (``is_kv_cache_spec_uniform``) are one group
  (``_get_kv_cache_groups_uniform_spec``);
* otherwise ``_get_kv_cache_groups_uniform_page_size`` (l. 949) collects the
  layers of each spec in the order the specs first appear, takes
  ``group_size`` = the fewest layers of a spec, or the most when the most is
  below 1.25 times the fewest (l. 1033-1042), and splits each spec's layers
  into ``cdiv(n, group_size)`` groups, the i-th taking
  ``layers[i::num_groups]`` (l. 1064-1066; the last ones padded).

Chunked local attention left after that is refused: the replay models full
and sliding-window groups only.
"""

from __future__ import annotations

from dataclasses import dataclass

from blockpool.core.admission import cdiv
from blockpool.core.attention import FULL_ATTENTION, SLIDING_WINDOW, AttentionKind
from blockpool.trace.sizing.hf_layers import LayerSpec


@dataclass(frozen=True)
class KVGroups:
    """The groups in vLLM's order: each one's attention and its layer indices."""

    attention: tuple[tuple[AttentionKind, int | None], ...]
    layers: tuple[tuple[int, ...], ...]

    @property
    def group_size(self) -> int:
        """Layers per group (``get_kv_cache_config_from_groups``: the most in any)."""
        return max(len(g) for g in self.layers)


def unify_hybrid(layers: tuple[LayerSpec, ...]) -> tuple[LayerSpec, ...]:
    """``unify_hybrid_kv_cache_specs``: windowed layers beside full ones become full."""
    kinds = {k for k, _ in layers}
    if len(set(layers)) <= 1 or "full" not in kinds:
        if len(set(layers)) > 1:
            raise ValueError(
                "--disable-hybrid-kv-cache-manager: the layers have no one spec vLLM can "
                "unify them to (it refuses: failed to convert the KV cache specs)"
            )
        return layers
    windows = {w for k, w in layers if k == "sliding"}
    chunks = {w for k, w in layers if k == "chunked"}
    if len(windows) > 1 or len(chunks) > 1 or (windows and chunks):
        raise ValueError(
            "--disable-hybrid-kv-cache-manager: vLLM cannot merge layers of different windows "
            "into one full-attention group"
        )
    return tuple(("full", None) for _ in layers)


def kv_cache_groups(layers: tuple[LayerSpec, ...], *, disable_hybrid: bool = False) -> KVGroups:
    """vLLM's ``get_kv_cache_groups`` for these layers (ValueError: not modelled)."""
    if not layers:
        raise ValueError("model config: no attention layer (an attention-free model has no pool)")
    if disable_hybrid:
        layers = unify_hybrid(layers)
    if any(k == "chunked" for k, _ in layers):
        raise ValueError(
            "model config: attention_chunk_size: vLLM keeps chunked local attention as its own "
            "KV-cache group, which the replay does not model (--disable-hybrid-kv-cache-manager "
            "makes those layers full attention, as vLLM does)"
        )
    by_spec: dict[LayerSpec, list[int]] = {}
    for i, spec in enumerate(layers):
        by_spec.setdefault(spec, []).append(i)
    counts = [len(v) for v in by_spec.values()]
    size = min(counts)
    if max(counts) < size * 1.25:
        size = max(counts)
    attention: list[tuple[AttentionKind, int | None]] = []
    groups: list[tuple[int, ...]] = []
    for (kind, window), idx in by_spec.items():
        n = 1 if len(by_spec) == 1 else cdiv(len(idx), size)
        for i in range(n):
            groups.append(tuple(idx[i::n]))
            attention.append((FULL_ATTENTION, None) if kind == "full" else (SLIDING_WINDOW, window))
    return KVGroups(tuple(attention), tuple(groups))
