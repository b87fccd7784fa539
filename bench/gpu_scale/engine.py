"""vLLM's real scheduler at a GPU's size, driven without a model.

``build_scheduler`` makes the installed vLLM's ``Scheduler`` or
``AsyncScheduler`` (or, with ``plugin=True``, blockpool's ``MirrorScheduler``
/ ``MirrorAsyncScheduler`` with ``BLOCKPOOL_MIRROR_ENDPOINT`` set: the plugin
is built only through its public constructor and the variable, as an engine
does) over a ``KVCacheConfig`` of one full-attention group of N blocks, with
prefix caching and vLLM's own block hasher (sha256).

``Driver`` runs the engine loop: add requests, ``schedule()``, a stand-in for
the forward pass (a sleep), ``update_from_output()`` with a
``ModelRunnerOutput`` that samples one token for every scheduled request whose
prefill is complete.  For the async scheduler it keeps two batches in flight
as vLLM's engine core does with async scheduling (``step_with_batch_queue``):
step N+1 is scheduled while step N "runs", and N's output comes back after;
the forward passes run on a virtual GPU (one after another, each ``forward_s``
long, plus ``forward_s_per_token`` for each token scheduled), so the
scheduler's time hides behind the GPU as it would.

Measured per step (perf_counter_ns around the calls): the scheduler's own time
(``add_request`` + ``schedule`` + ``update_from_output``), the whole step, the
time the garbage collector ran during the step.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_scale.step_records import GcClock, Steps
from bench.gpu_scale.workload import Planned

ENV_ENDPOINT = "BLOCKPOOL_MIRROR_ENDPOINT"


def tiny_llama_config(max_positions: int) -> dict[str, Any]:
    """A small Llama config.json: the scheduler only reads the shape, no
    weights are loaded."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": 32000,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }


@dataclass
class Shape:
    num_blocks: int = 524_288
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 16_384
    async_sched: bool = False


def vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def build_scheduler(shape: Shape, workdir: Path, *, plugin: bool, endpoint: str = "") -> Any:
    """The scheduler (see the module doc).  ``endpoint``: the plugin's PUB
    endpoint (needed with ``plugin``)."""
    model = workdir / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(tiny_llama_config(shape.max_model_len)))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ["HF_HUB_OFFLINE"] = "1"
    if plugin:
        if not endpoint:
            raise ValueError("the plugin needs an endpoint")
        os.environ[ENV_ENDPOINT] = endpoint
    else:
        os.environ.pop(ENV_ENDPOINT, None)

    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cls: Any
    if plugin:
        from blockpool_vllm.scheduler import MirrorAsyncScheduler, MirrorScheduler

        cls = MirrorAsyncScheduler if shape.async_sched else MirrorScheduler
    elif shape.async_sched:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        cls = AsyncScheduler
    else:
        from vllm.v1.core.sched.scheduler import Scheduler

        cls = Scheduler

    model_config = ModelConfig(
        model=str(model), skip_tokenizer_init=True, max_model_len=shape.max_model_len, seed=0
    )
    cache = CacheConfig(block_size=shape.block_size, enable_prefix_caching=True)
    sched_cfg = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_model_len,
        is_encoder_decoder=False,
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=cache,
        scheduler_config=sched_cfg,
        device_config=DeviceConfig(device="cpu"),
    )
    vllm_config.cache_config.num_gpu_blocks = shape.num_blocks
    spec = FullAttentionSpec(
        block_size=shape.block_size, num_kv_heads=2, head_size=32, dtype=torch.float16
    )
    kv = KVCacheConfig(
        num_blocks=shape.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=shape.block_size,
        log_stats=True,
    )


def block_hasher(block_size: int) -> Any:
    """vLLM's own request block hasher, sha256, with its NONE_HASH set."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256)
    return kv_cache_utils.get_request_block_hasher(block_size, sha256)


class Driver:
    """The engine loop around one scheduler (see the module doc)."""

    def __init__(self, sched: Any, workload: Any, shape: Shape, concurrency: int) -> None:
        self.sched = sched
        self.workload = workload
        self.shape = shape
        self.concurrency = concurrency
        self.hasher = block_hasher(shape.block_size)
        self.pool = sched.kv_cache_manager.block_pool
        self.plans: dict[str, Planned] = {}
        self.sampled: dict[str, int] = {}
        self.live = 0
        self.added = 0
        self.finished = 0
        self.finished_ids = hashlib.blake2b(digest_size=16)
        self.fingerprint = hashlib.blake2b(digest_size=16)
        self.total_tokens = 0
        self.output_tokens = 0
        self.preemptions = 0
        self.hits = 0
        self.queries = 0
        self.max_usage = 0.0
        self.evictions = 0
        self.steps_run = 0
        self.depth = 2 if shape.async_sched else 1
        self.inflight: deque[tuple[Any, Any, float]] = deque()
        self.gpu_free_at = 0.0
        self.output_cap = 0  # > 0: outputs no longer than this (a quick warm-up)
        # a forward pass longer by this much per token scheduled (0: every pass
        # ``forward_s`` long; a GPU's prefill-heavy steps take longer)
        self.forward_s_per_token = 0.0
        self._count_evictions()

        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self._request_cls = Request
        # vLLM <= 0.2x: eos_token_id is a required argument (ignored with ignore_eos)
        params = inspect.signature(Request.__init__).parameters
        self._request_kw: dict[str, Any] = (
            {"eos_token_id": None} if "eos_token_id" in params else {}
        )
        self._params_cls = SamplingParams
        self._output_cls = ModelRunnerOutput

    def _count_evictions(self) -> None:
        # vLLM's pool calls self._maybe_evict_cached_block(block) for each block it
        # hands out; True: a cached block lost its hash.  The same wrapper in both runs.
        original = getattr(self.pool, "_maybe_evict_cached_block", None)
        if original is None:
            return

        def counted(block: Any) -> Any:
            done = original(block)
            if done:
                self.evictions += 1
            return done

        self.pool._maybe_evict_cached_block = counted

    # ------------------------------------------------------------ requests

    def _make_requests(self) -> list[Any]:
        made: list[Any] = []
        while self.live + len(made) < self.concurrency:
            plan = self.workload.next()
            self.plans[plan.req_id] = plan
            self.sampled[plan.req_id] = 0
            made.append(
                self._request_cls(
                    plan.req_id,
                    plan.prompt,
                    self._params_cls(
                        max_tokens=min(plan.max_tokens, self.output_cap or plan.max_tokens),
                        ignore_eos=True,
                    ),
                    None,
                    block_hasher=self.hasher,
                    **self._request_kw,
                )
            )
        return made

    def _model_output(self, out: Any) -> Any:
        """What a model runner would return for ``out``: one sampled token for
        every request whose prefill is complete, none for a partial chunk."""
        ids = list(out.num_scheduled_tokens)
        requests = self.sched.requests
        sampled: list[list[int]] = []
        for rid in ids:
            r = requests[rid]
            chunk = getattr(r, "is_prefill_chunk", None)
            if chunk is None:
                chunk = r.num_computed_tokens < r.num_tokens
            if chunk:
                sampled.append([])
                continue
            k = self.sampled[rid]
            self.sampled[rid] = k + 1
            reply = self.plans[rid].reply
            sampled.append([reply[k % len(reply)]])
        return self._output_cls(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )

    def _took(self, result: Any) -> None:
        for eco in result.values():
            for o in eco.outputs:
                self.output_tokens += len(o.new_token_ids)
                if o.finish_reason is not None:
                    rid = o.request_id
                    self.finished += 1
                    self.live -= 1
                    self.finished_ids.update(rid.encode() + b"\0")
                    self.workload.finished(rid)
                    self.plans.pop(rid, None)
                    self.sampled.pop(rid, None)
            st = eco.scheduler_stats
            if st is not None and st.prefix_cache_stats is not None:
                self.hits += st.prefix_cache_stats.hits
                self.queries += st.prefix_cache_stats.queries

    # ----------------------------------------------------------------- loop

    def step(self, forward_s: float, rec: Steps | None, gc_clock: GcClock | None) -> None:
        sched = self.sched
        now = time.perf_counter_ns
        t_step = now()
        if gc_clock is not None:
            gc_clock.in_step_ns = 0
        news = self._make_requests()
        cpu = time.thread_time_ns
        c_add = cpu()
        t0 = now()
        for r in news:
            sched.add_request(r)
        t_add = now() - t0
        c_add = cpu() - c_add
        c_sched = 0
        self.live += len(news)
        self.added += len(news)
        t_sched = 0
        if sched.has_requests():
            c0 = cpu()
            t0 = now()
            out = sched.schedule()
            t_sched = now() - t0
            c_sched = cpu() - c0
            n = int(out.total_num_scheduled_tokens)
            self.total_tokens += n
            self.fingerprint.update(repr(sorted(out.num_scheduled_tokens.items())).encode())
            self.preemptions += len(getattr(out, "preempted_req_ids", None) or ())
            mro = self._model_output(out)
            t = time.perf_counter()
            launch = max(t, self.gpu_free_at)
            if n and forward_s:  # (a pass as long as its tokens make it, on a GPU)
                forward_s += n * self.forward_s_per_token
            self.gpu_free_at = launch + (forward_s if n else 0.0)
            self.inflight.append((out, mro, self.gpu_free_at))
        else:
            n = 0
        t_upd = 0
        c_upd = 0
        late = 0
        if self.inflight and (len(self.inflight) >= self.depth or not sched.has_requests()):
            out, mro, done_at = self.inflight.popleft()
            wait = done_at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
                late = int((time.perf_counter() - done_at) * 1e9)
            c0 = cpu()
            t0 = now()
            result = sched.update_from_output(out, mro)
            t_upd = now() - t0
            c_upd = cpu() - c0
            self._took(result)
        self.max_usage = max(self.max_usage, float(sched.kv_cache_manager.usage))
        self.steps_run += 1
        if rec is not None:
            rec.add_ns.append(t_add)
            rec.schedule_ns.append(t_sched)
            rec.update_ns.append(t_upd)
            rec.sched_ns.append(t_add + t_sched + t_upd)
            rec.step_ns.append(now() - t_step)
            rec.gc_ns.append(gc_clock.in_step_ns if gc_clock is not None else 0)
            rec.tokens.append(n)
            rec.late_ns.append(late)
            rec.sched_cpu_ns.append(c_add + c_sched + c_upd)

    def pool_facts(self) -> dict[str, Any]:
        cached = getattr(self.pool, "cached_block_hash_to_block", None)
        n = int(self.pool.num_gpu_blocks)
        return {
            # cached hashes over blocks: ~1.0 once every block was used (the pool is full)
            "cached_fraction": round(len(cached) / n, 4) if cached is not None else None,
            "num_blocks": int(self.pool.num_gpu_blocks),
            "usage_now": round(float(self.sched.kv_cache_manager.usage), 4),
            "max_usage": round(self.max_usage, 4),
            "free_blocks": int(self.pool.get_num_free_blocks()),
            "cached_hashes": len(cached) if cached is not None else None,
            "evictions": self.evictions,
        }

    def outcome(self) -> dict[str, Any]:
        return {
            "steps": self.steps_run,
            "added": self.added,
            "finished": self.finished,
            "tokens_scheduled": self.total_tokens,
            "output_tokens": self.output_tokens,
            "prefix_hits": self.hits,
            "prefix_queries": self.queries,
            "preemptions": self.preemptions,
            "schedule_fingerprint": self.fingerprint.hexdigest(),
            "finished_fingerprint": self.finished_ids.hexdigest(),
            "running": len(self.sched.running),
            "waiting": len(self.sched.waiting),
        }
