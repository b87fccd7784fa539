"""Each operation's result is declared once, as a ``TypedDict`` next to its
handler: the record names it (``OpRecord[Allocated]``), the handler's return
type is it, and what the handler builds has exactly its keys."""

from __future__ import annotations

import typing
from typing import Any, get_args, get_type_hints

import typing_extensions

from blockpool.runtime import PoolRuntime, RuntimeConfig, ops


def _named_result(record: type[Any]) -> Any:
    (base,) = [b for b in record.__orig_bases__ if typing.get_origin(b) is ops.OpRecord]
    (result,) = get_args(base)
    return result


def test_every_record_names_the_result_its_handler_returns() -> None:
    for spec in (*ops.SPECS, *ops.ENGINE_SPECS):
        result = _named_result(spec.record)
        handler = spec.handler
        module = __import__(handler.__module__, fromlist=["_"])
        # ``Outcome[Allocated]``: the result and the change (a name read under TYPE_CHECKING)
        returned = eval(handler.__annotations__["return"], vars(module))
        assert get_args(returned)[0] is result, spec.name
        assert typing_extensions.is_typeddict(result), spec.name
        assert result.__doc__, spec.name  # the schema's description


def test_what_each_handler_builds_has_its_result_keys() -> None:
    rt = PoolRuntime(RuntimeConfig(num_blocks=16, block_size=4))
    applied = [
        ops.AllocateOp(num_blocks=2),
        ops.TouchOp(block_ids=[1]),
        ops.CacheOp(block_ids=[1], token_ids=[1, 2, 3, 4]),
        ops.LookupOp(block_hash="ab" * 32),
        ops.PrefixLookupOp(token_ids=[1, 2, 3, 4, 5]),
        ops.FreeOp(block_ids=[1, 1, 2]),
        ops.EvictOp(block_ids=[1]),
        ops.AdmitOp(request_id="r", token_ids=list(range(9))),
        ops.AppendOp(request_id="r", token_ids=[9, 10, 11, 12]),
        ops.FinishOp(request_id="r"),
        ops.ResetOp(),
    ]
    assert {type(op) for op in applied} == {s.record for s in ops.SPECS}
    for op in applied:
        result = rt.apply(op)
        shape = _named_result(type(op))
        assert list(result) == list(get_type_hints(shape)), op.op
    # an engine's record (a mirror's): its result too
    (bid,) = rt.apply(ops.AllocateOp(num_blocks=1))["block_ids"]
    engine = ops.EngineCacheOp(block_ids=[bid], block_hashes=[b"\x07" * 32])
    assert {type(engine)} == {s.record for s in ops.ENGINE_SPECS}
    result = rt.apply(engine)
    assert list(result) == list(get_type_hints(_named_result(type(engine)))) == ["block_ids"]
    assert rt.pool.blocks[bid].block_hash == b"\x07" * 32 + b"\0" * 4
    rt.check()
