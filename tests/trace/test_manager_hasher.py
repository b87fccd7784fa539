"""RequestManager's faster block hasher gives exactly the generic hasher's hashes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from blockpool import BlockPool, RequestManager, check_invariants, get_request_block_hasher
from blockpool.core.hashing import HASH_FUNCTIONS
from blockpool.core.request import LoRARequest, Request


@given(
    tokens=st.lists(st.integers(0, 50), min_size=1, max_size=40),
    appends=st.lists(st.lists(st.integers(0, 50), max_size=7), max_size=6),
    bs=st.integers(1, 5),
    name=st.sampled_from(sorted(HASH_FUNCTIONS)),
    lora=st.sampled_from([None, "adapter"]),
    salt=st.sampled_from([None, "salt"]),
)
def test_same_hashes_as_the_generic_hasher(
    tokens: list[int],
    appends: list[list[int]],
    bs: int,
    name: str,
    lora: str | None,
    salt: str | None,
) -> None:
    fn = HASH_FUNCTIONS[name]
    pool = BlockPool(128, True, bs)
    mgr = RequestManager(pool, hash_fn=fn)
    mgr.admit("r", tokens, lora_name=lora, cache_salt=salt)
    ref = Request(
        "ref",
        tokens,
        block_hasher=get_request_block_hasher(bs, fn),
        lora_request=LoRARequest(lora) if lora else None,
        cache_salt=salt,
    )
    assert mgr.block_hashes_of("r") == ref.block_hashes
    for chunk in appends:
        if not chunk:
            continue
        mgr.append_tokens("r", chunk)
        ref.append_output_token_ids(chunk)
        assert mgr.block_hashes_of("r") == ref.block_hashes
    mgr.finish("r")
    check_invariants(pool)
