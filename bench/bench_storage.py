"""Throughput of KVCacheStorage's block operations, side by side with a plain copy.

For each operation (write a run of tokens, gather a request's K/V through
its block table, copy blocks, zero blocks) the same run also times a plain
``tensor.copy_`` (``zero_`` for zeroing) of the same number of bytes on the
same device; repetitions are interleaved (op, baseline, op, baseline, ...)
and the medians compared, so machine noise hits both alike.  Block ids are
random, as a long-running pool scatters them.  Argument checks are included
in the operation's time.  Target: ratio >= 0.8.

    .venv/bin/python bench/bench_storage.py                  # auto device
    .venv/bin/python bench/bench_storage.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from output import write_json

from blockpool.storage import KVCacheShape, KVCacheStorage, resolve_device, resolve_dtype

DEFAULT_JSON = pathlib.Path(__file__).resolve().parent / "results" / "storage.json"
TARGET = 0.8


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float16, bfloat16, float32 (default per device)")
    p.add_argument("--layers", type=int, default=None, help="default: 32 on CUDA, 8 on CPU")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--blocks", type=int, default=None, help="default: 4096 on CUDA, 512 on CPU")
    p.add_argument("--op-blocks", type=int, default=None, help="blocks per op (default blocks/4)")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--copy-chunk-mib", type=int, default=None, help="copy_blocks scratch (default per device)"
    )
    p.add_argument("--json", type=pathlib.Path, default=DEFAULT_JSON)
    return p.parse_args()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _cases(
    st: KVCacheStorage, k: int, gen: torch.Generator
) -> dict[str, tuple[int, Callable[[], object], Callable[[], object]]]:
    """name -> (bytes moved, operation, plain baseline over the same bytes)."""
    dev, dt, bs = st.device, st.dtype, st.block_size
    perm = torch.randperm(st.num_blocks, generator=gen).tolist()
    table, others = perm[:k], perm[k : 2 * k]
    n = k * bs
    slots = st.slot_mapping(table, 0, n)
    kv = torch.randn((*st.buffer.shape[:2], n, *st.buffer.shape[4:]), generator=gen).to(dev, dt)
    out = torch.empty_like(kv)
    nbytes = kv.numel() * kv.element_size()
    src, dst = (
        torch.randn(kv.numel(), generator=gen).to(dev, dt),
        torch.empty(kv.numel(), dtype=dt, device=dev),
    )
    table_t = torch.tensor(table, device=dev)
    others_t = torch.tensor(others, device=dev)

    def plain() -> object:
        return dst.copy_(src)

    return {
        "write": (nbytes, lambda: st.write(slots, kv), plain),
        "gather": (nbytes, lambda: st.gather(table_t, n, out=out), plain),
        "copy": (k * st.bytes_per_block, lambda: st.copy_blocks(table_t, others_t), plain),
        "zero": (k * st.bytes_per_block, lambda: st.zero_blocks(table_t), lambda: dst.zero_()),
    }


def _measure(
    cases: dict[str, tuple[int, Callable[[], object], Callable[[], object]]],
    reps: int,
    device: torch.device,
) -> list[dict[str, float | str | int]]:
    for _nbytes, op, base in cases.values():  # warm up: allocators, scratch, caches
        for _ in range(2):
            op()
            base()
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in cases}
    for _ in range(reps):
        for name, (_nbytes, op, base) in cases.items():
            times[name][0].append(_time(op, device))
            times[name][1].append(_time(base, device))
    rows: list[dict[str, float | str | int]] = []
    for name, (nbytes, _op, _base) in cases.items():
        op_s, base_s = statistics.median(times[name][0]), statistics.median(times[name][1])
        rows.append(
            {
                "op": name,
                "bytes": nbytes,
                "op_ms": op_s * 1e3,
                "op_gbps": nbytes / op_s / 1e9,
                "plain_ms": base_s * 1e3,
                "plain_gbps": nbytes / base_s / 1e9,
                "ratio": base_s / op_s,
            }
        )
    return rows


def main() -> int:
    args = _parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    on_cuda = device.type == "cuda"
    layers = args.layers or (32 if on_cuda else 8)
    blocks = args.blocks or (4096 if on_cuda else 512)
    k = args.op_blocks or max(1, blocks // 4)
    shape = KVCacheShape(layers, args.kv_heads, args.head_size, args.block_size)
    chunk = args.copy_chunk_mib << 20 if args.copy_chunk_mib else None
    st = KVCacheStorage(shape, blocks, device=device, dtype=dtype, copy_chunk_bytes=chunk)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = _measure(_cases(st, k, gen), args.reps, device)
    mem = st.memory_facts()
    facts = mem.as_dict()
    name = torch.cuda.get_device_name(device) if on_cuda else platform.processor() or "cpu"
    geometry = (
        f"{layers} layers x {args.kv_heads} heads x {args.head_size}, block {args.block_size}"
    )
    print(f"device {facts['device']} ({name}), {torch.get_num_threads()} CPU threads")
    print(f"dtype {facts['dtype']}, {geometry}: {facts['bytes_per_block']} B/block")
    print(
        f"{blocks} blocks ({mem.bytes_allocated / 2**20:.0f} MiB), {k} random blocks per op,"
        f" copy chunk {st.copy_chunk_bytes >> 20} MiB, median of {args.reps} interleaved reps"
    )
    print(f"{'op':<7}{'MiB':>8}{'op ms':>10}{'op GB/s':>10}{'plain GB/s':>12}{'ratio':>8}")
    for r in rows:
        flag = "" if float(r["ratio"]) >= TARGET else f"  < {TARGET}"
        print(
            f"{r['op']!s:<7}{int(r['bytes']) / 2**20:>8.1f}{float(r['op_ms']):>10.3f}"
            f"{float(r['op_gbps']):>10.2f}{float(r['plain_gbps']):>12.2f}{float(r['ratio']):>8.2f}{flag}"
        )
    result = {
        "device": facts["device"],
        "device_name": name,
        "copy_chunk_bytes": st.copy_chunk_bytes,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "memory": facts,
        "op_blocks": k,
        "reps": args.reps,
        "target_ratio": TARGET,
        "results": rows,
    }
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
