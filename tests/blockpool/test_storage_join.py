"""The stand-in model, the pool/storage join, verify and paged attention,
driven by real admissions through BlockPool + RequestManager.

Device and dtype: the ``device`` / ``dtype`` fixtures (conftest.py;
BLOCKPOOL_STORAGE_DEVICE / BLOCKPOOL_STORAGE_DTYPE, library defaults otherwise).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from blockpool import BlockPool, RequestManager, check_invariants
from blockpool.storage import (
    KVCacheShape,
    KVCacheStorage,
    StandInModel,
    StorageError,
    attention,
    expected_kv,
    paged_attention,
    verify_request,
    write_request_tokens,
)

BS = 4
SHAPE = KVCacheShape(num_layers=2, num_kv_heads=2, head_size=16, block_size=BS)
NUM_Q_HEADS = 4


@pytest.fixture
def model() -> StandInModel:
    return StandInModel(SHAPE, seed=7)


def _setup(
    num_blocks: int, device: torch.device, dtype: torch.dtype, *, caching: bool = True
) -> tuple[BlockPool, RequestManager, KVCacheStorage]:
    pool = BlockPool(num_blocks, enable_caching=caching, hash_block_size=BS)
    return pool, RequestManager(pool), KVCacheStorage(SHAPE, num_blocks, device=device, dtype=dtype)


def _admit_and_write(
    mgr: RequestManager, st: KVCacheStorage, model: StandInModel, rid: str, tokens: list[int]
) -> list[int]:
    adm = mgr.admit(rid, tokens)
    table = adm.block_ids[0]
    written = write_request_tokens(st, model, table, tokens, adm.num_computed_tokens)
    assert written == len(tokens) - adm.num_computed_tokens
    return table


def _queries(
    model: StandInModel, tokens: list[int], start: int, layer: int, dev: torch.device
) -> torch.Tensor:
    return model.queries(
        tokens[start:],
        list(range(start, len(tokens))),
        layer=layer,
        num_heads=NUM_Q_HEADS,
        device=dev,
    )


# ------------------------------------------------------------------- model


def test_model_is_deterministic_and_vectorized(model: StandInModel, device: torch.device) -> None:
    tokens, pos = [5, 9, 5, 1000003, 0], [0, 1, 2, 3, 4]
    kv = model.kv(tokens, pos, device=device, dtype=torch.float32)
    assert kv.shape == (2, 2, 5, 2, 16) and kv.device.type == device.type
    assert torch.equal(
        kv, StandInModel(SHAPE, seed=7).kv(tokens, pos, device=device, dtype=torch.float32)
    )
    one_by_one = torch.cat(
        [
            model.kv([t], [p], device=device, dtype=torch.float32)
            for t, p in zip(tokens, pos, strict=True)
        ],
        2,
    )
    assert torch.equal(kv, one_by_one)
    assert float(kv.min()) >= -1.0 and float(kv.max()) < 1.0
    assert 0.3 < float(kv.abs().mean()) < 0.7  # spread over [-1, 1)


def test_model_depends_on_token_position_layer_and_seed(
    model: StandInModel, device: torch.device
) -> None:
    kv = model.kv([5, 5, 6], [3, 4, 3], device=device, dtype=torch.float32)
    same_token_other_position = kv[:, :, 0] != kv[:, :, 1]
    other_token_same_position = kv[:, :, 0] != kv[:, :, 2]
    assert bool(same_token_other_position.float().mean() > 0.99)
    assert bool(other_token_same_position.float().mean() > 0.99)
    assert bool((kv[0] != kv[1]).float().mean() > 0.99)  # layers differ
    assert bool((kv[:, 0] != kv[:, 1]).float().mean() > 0.99)  # K differs from V
    other_seed = StandInModel(SHAPE, seed=8).kv(
        [5, 5, 6], [3, 4, 3], device=device, dtype=torch.float32
    )
    assert bool((kv != other_seed).float().mean() > 0.99)


def test_model_rejects_bad_inputs(model: StandInModel, device: torch.device) -> None:
    with pytest.raises(StorageError, match="2 token ids but 3 positions"):
        model.kv([1, 2], [0, 1, 2], device=device, dtype=torch.float32)
    with pytest.raises(StorageError, match="ints"):
        model.kv(torch.tensor([1.5]), [0], device=device, dtype=torch.float32)
    with pytest.raises(StorageError, match="layer"):
        model.queries([1], [0], layer=2, num_heads=4, device=device)


# -------------------------------------------------------------- join/verify


def test_write_and_verify_report_the_bad_block_and_slot(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(10, device, dtype)
    tokens = list(range(300, 314))  # 3 full blocks + 2 tokens
    table = _admit_and_write(mgr, st, model, "a", tokens)
    assert table == [1, 2, 3, 4]
    ok = verify_request(st, model, table, tokens)
    assert (ok.ok, ok.num_tokens, ok.bad_block_ids, ok.first_bad_slot) == (True, 14, [], None)
    st.layer(1)[1, 3, 2, 1, 5] += 1  # V of block 3, offset 2, in layer 1: token 10
    st.layer(0)[0, 4, 0, 0, 0] += 1  # K of block 4, offset 0: token 12
    bad = verify_request(st, model, table, tokens)
    assert not bad.ok
    assert bad.as_dict() == {
        "ok": False,
        "num_tokens": 14,
        "bad_block_ids": [3, 4],
        "first_bad_token": 10,
        "first_bad_slot": 3 * BS + 2,
    }
    assert verify_request(st, model, table, tokens, num_tokens=10).ok
    as_tensors = verify_request(st, model, torch.tensor(table), torch.tensor(tokens))
    assert as_tensors == bad
    mgr.finish("a")
    check_invariants(pool)


def test_write_rejects_bad_ranges_before_writing(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    st = KVCacheStorage(SHAPE, 6, device=device, dtype=dtype)
    tokens = list(range(9))
    with pytest.raises(StorageError, match="end must be at most 8"):
        write_request_tokens(st, model, [1, 2], tokens, 0)  # 9 tokens, 2 blocks
    with pytest.raises(StorageError, match="end must be at most 9"):
        write_request_tokens(st, model, [1, 2, 3], tokens, 0, 10)
    with pytest.raises(StorageError, match="start must be at most 4"):
        write_request_tokens(st, model, [1, 2, 3], tokens, 5, 4)
    with pytest.raises(StorageError, match="must lie in"):
        write_request_tokens(st, model, [1, 2, 6], tokens, 0)
    assert not st.buffer.any()
    assert write_request_tokens(st, model, [1, 2, 3], tokens, 9) == 0


def test_decode_tokens_fill_new_blocks(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(8, device, dtype)
    tokens = [11, 12, 13, 14, 15, 16]
    _admit_and_write(mgr, st, model, "a", tokens)
    for tok in range(40, 47):  # crosses two block boundaries
        grown = mgr.append_tokens("a", [tok])
        tokens.append(tok)
        table = mgr.get("a").block_ids()[0]
        assert grown[0] == ([table[-1]] if len(tokens) % BS == 1 else [])
        write_request_tokens(st, model, table, tokens, len(tokens) - 1)
        assert verify_request(st, model, table, tokens).ok
    assert len(mgr.get("a").block_ids()[0]) == math.ceil(13 / BS)
    mgr.finish("a")
    check_invariants(pool)


# ---------------------------------------------------------------- attention


def _explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v, head by head, in float64."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for h in range(q.shape[1]):
        scores = q[:, h] @ k[:, h // group].T / math.sqrt(q.shape[2])
        for i in range(q.shape[0]):
            scores[i, start + i + 1 :] = -math.inf
        out[:, h] = torch.softmax(scores, dim=-1) @ v[:, h // group]
    return out


def test_paged_attention_matches_explicit_math(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(10, device, dtype)
    tokens = list(range(70, 81))
    table = _admit_and_write(mgr, st, model, "a", tokens)
    kv = expected_kv(st, model, tokens, 0, len(tokens))
    for layer in (0, 1):
        for start in (0, 6, 10):  # prefill, a chunk, the last token (decode)
            q = _queries(model, tokens, start, layer, device)
            got = paged_attention(st, layer, table, len(tokens), q)
            want = _explicit_attention(q, kv[layer, 0], kv[layer, 1], start)
            assert got.shape == (len(tokens) - start, NUM_Q_HEADS, 16)
            assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    full = paged_attention(st, 1, table, len(tokens), _queries(model, tokens, 0, 1, device))
    last = paged_attention(st, 1, table, len(tokens), _queries(model, tokens, 10, 1, device))
    assert torch.allclose(full[-1:], last, rtol=1e-6, atol=1e-6)
    mgr.finish("a")
    check_invariants(pool)


def test_attention_rejects_bad_shapes(device: torch.device) -> None:
    k = torch.zeros(5, 2, 16, device=device)
    with pytest.raises(StorageError, match="do not fit"):
        attention(torch.zeros(1, 3, 16, device=device), k, k)
    with pytest.raises(StorageError, match="outside"):
        attention(torch.zeros(2, 4, 16, device=device), k, k, query_start=4)
    with pytest.raises(StorageError, match="must be"):
        attention(torch.zeros(4, 16, device=device), k, k)


# ------------------------------------------------------ pool-driven scenarios


def test_prefix_hit_reuses_exact_kv_and_attention_matches_recompute(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(16, device, dtype)
    prefix = list(range(500, 512))  # 3 full blocks
    a_tokens = [*prefix, 1, 2, 3, 4, 5]
    b_tokens = [*prefix, 9, 8, 7, 6, 5, 4]
    a_table = _admit_and_write(mgr, st, model, "a", a_tokens)
    mgr.finish("a")  # A's blocks stay cached in the free queue

    adm = mgr.admit("b", b_tokens)
    assert adm.num_hit_blocks == 3 and adm.num_computed_tokens == 12
    b_table = adm.block_ids[0]
    assert b_table[:3] == a_table[:3]
    # Before B computes anything, its reused blocks already hold B's K/V.
    assert verify_request(st, model, b_table, b_tokens, num_tokens=12).ok
    assert verify_request(st, model, b_table, b_tokens).bad_block_ids == b_table[3:]
    write_request_tokens(st, model, b_table, b_tokens, adm.num_computed_tokens)
    assert verify_request(st, model, b_table, b_tokens).ok

    # No cache: the same tokens recomputed into fresh blocks of another pool.
    fresh_pool, fresh_mgr, fresh_st = _setup(16, device, dtype, caching=False)
    fresh_mgr.admit("decoy", list(range(28)))  # blocks 1-7: B lands on 8-12
    fresh_adm = fresh_mgr.admit("b", b_tokens)
    assert fresh_adm.num_hit_blocks == 0
    fresh_table = fresh_adm.block_ids[0]
    assert not set(fresh_table) & set(b_table)
    write_request_tokens(fresh_st, model, fresh_table, b_tokens, 0)
    for layer in range(SHAPE.num_layers):
        q = _queries(model, b_tokens, 0, layer, device)
        cached = paged_attention(st, layer, b_table, len(b_tokens), q)
        recomputed = paged_attention(fresh_st, layer, fresh_table, len(b_tokens), q)
        assert torch.allclose(cached, recomputed, rtol=0, atol=1e-7)
    mgr.finish("b")
    fresh_mgr.finish("b")
    fresh_mgr.finish("decoy")
    check_invariants(pool)
    check_invariants(fresh_pool)


def test_running_request_shares_its_prefix(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(16, device, dtype)
    a_tokens = list(range(20, 31))
    b_tokens = [*a_tokens[:8], 99, 98, 97]
    a_table = _admit_and_write(mgr, st, model, "a", a_tokens)
    b_table = _admit_and_write(mgr, st, model, "b", b_tokens)
    assert b_table[:2] == a_table[:2] and pool.blocks[a_table[0]].ref_cnt == 2
    assert verify_request(st, model, a_table, a_tokens).ok  # B wrote only its own blocks
    assert verify_request(st, model, b_table, b_tokens).ok
    mgr.finish("a")
    mgr.finish("b")
    check_invariants(pool)


def test_evicted_block_is_overwritten_not_mixed(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(7, device, dtype)  # null block + 6
    a_tokens = list(range(100, 112))  # 3 full blocks, cached when A finishes
    a_table = _admit_and_write(mgr, st, model, "a", a_tokens)
    mgr.finish("a")
    filler = _admit_and_write(mgr, st, model, "filler", list(range(900, 912)))
    assert not set(filler) & set(a_table)

    c_tokens = list(range(200, 212))  # needs the 3 blocks A left behind
    c_table = _admit_and_write(mgr, st, model, "c", c_tokens)
    assert sorted(c_table) == sorted(a_table)
    assert all(pool.blocks[b].block_hash is not None for b in c_table)  # C's hashes now
    assert verify_request(st, model, c_table, c_tokens).ok
    gone = verify_request(st, model, a_table, a_tokens)
    assert gone.bad_block_ids == a_table
    # Not one slot of the reused blocks still holds any of A's K/V.
    a_kv = expected_kv(st, model, a_tokens, 0, 12)
    for i, block in enumerate(a_table):
        now = st.buffer[:, :, block]  # [layers, 2, block_size, heads, head_size]
        old = a_kv[:, :, i * BS : (i + 1) * BS]
        assert not bool((now == old).all(dim=(-1, -2)).any())
    assert mgr.lookup(a_tokens) == 0  # A's prefix is no longer cached
    mgr.finish("c")
    mgr.finish("filler")

    # A again: recomputed into whatever blocks come up, exact again.
    a2 = _admit_and_write(mgr, st, model, "a2", a_tokens)
    assert verify_request(st, model, a2, a_tokens).ok
    mgr.finish("a2")
    check_invariants(pool)


def test_memory_breakdown_from_pool_counts(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    pool, mgr, st = _setup(12, device, dtype)
    _admit_and_write(mgr, st, model, "a", list(range(10)))  # 3 blocks, 2 cached
    _admit_and_write(mgr, st, model, "b", list(range(50, 58)))  # 2 blocks
    mgr.finish("a")
    blocks = pool.blocks[1:]
    in_use = sum(b.ref_cnt > 0 for b in blocks)
    cached = sum(b.ref_cnt == 0 and b.block_hash is not None for b in blocks)
    empty = sum(b.ref_cnt == 0 and b.block_hash is None for b in blocks)
    assert (in_use, cached, empty) == (2, 2, 7)
    got = st.memory_breakdown(num_in_use=in_use, num_cached=cached, num_empty=empty)
    per = st.bytes_per_block
    assert (got.live_bytes, got.cached_bytes, got.empty_bytes, got.other_bytes) == (
        2 * per,
        2 * per,
        7 * per,
        per,  # the null block
    )
    assert got.total_bytes == st.memory_facts().bytes_allocated
    mgr.finish("b")
    check_invariants(pool)


def test_seeded_soak_every_running_request_stays_exact(
    model: StandInModel, device: torch.device, dtype: torch.dtype
) -> None:
    rng = random.Random(11)
    pool, mgr, st = _setup(24, device, dtype)
    prefixes = [[rng.randrange(1000) for _ in range(rng.choice((4, 8, 12)))] for _ in range(4)]
    running: dict[str, list[int]] = {}
    hits = 0
    for step in range(150):
        op = rng.random()
        if op < 0.4 or not running:
            rid = f"r{step}"
            tokens = [
                *rng.choice(prefixes),
                *(rng.randrange(1000) for _ in range(rng.randrange(1, 7))),
            ]
            try:
                adm = mgr.admit(rid, tokens)
            except ValueError:
                continue
            hits += adm.num_hit_blocks
            assert verify_request(st, model, adm.block_ids[0], tokens, adm.num_computed_tokens).ok
            write_request_tokens(st, model, adm.block_ids[0], tokens, adm.num_computed_tokens)
            running[rid] = tokens
        elif op < 0.75:
            rid = rng.choice(sorted(running))
            tok = rng.randrange(1000)
            try:
                mgr.append_tokens(rid, [tok])
            except ValueError:
                continue
            running[rid].append(tok)
            write_request_tokens(
                st, model, mgr.get(rid).block_ids()[0], running[rid], len(running[rid]) - 1
            )
        else:
            rid = rng.choice(sorted(running))
            mgr.finish(rid)
            del running[rid]
        for rid, tokens in running.items():
            assert verify_request(st, model, mgr.get(rid).block_ids()[0], tokens).ok, rid
    assert hits > 10
    for rid in list(running):
        mgr.finish(rid)
    check_invariants(pool)
