"""The request-level API: admit, append tokens, finish, list; and /batch."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from app.api.costly import CostlyRead
from app.api.declare import AsBuilt, returns, route
from app.api.deps import EngineDep, ReadAuth, WriteAuth, run
from app.pool.schemas import AdmitBody, AppendBody, AppendOp, BatchRequest, FinishOp
from app.pool.views import requests as views
from app.pool.views.operations import Batch, BatchResult
from app.pool.views.requests import RequestInfo, Requests, Verified
from app.shared.errors import OperationError, TooLarge
from app.web.error_shape import ERROR_RESPONSES, body_of
from blockpool.runtime.ops import Admitted, Appended, Finished
from blockpool.runtime.trial import BatchRefused, apply_all

router = APIRouter(prefix="/api", tags=["requests"], responses=ERROR_RESPONSES)

Rid = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")]


@router.post(
    "/requests",
    responses=returns(Admitted, 201),
    status_code=201,
    dependencies=[WriteAuth],
    summary="Admit a request",
)
async def admit(op: AdmitBody, engine: EngineDep) -> AsBuilt[Admitted]:
    """Hashes the full blocks, reuses the longest cached prefix (never the
    block of the last prompt token), allocates the rest and caches the full
    blocks.  409 ``not_enough_blocks`` (nothing changed) when it cannot fit."""
    return await run(engine, op)


@route(router.get, "/requests", Requests, "Running requests", ReadAuth)
async def list_requests(
    engine: EngineDep,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> Requests:
    return views.requests(engine, offset, limit)


@route(router.get, "/requests/{request_id}", RequestInfo, "One request", ReadAuth)
async def get_request(engine: EngineDep, request_id: Rid) -> RequestInfo:
    """Its blocks per group, which were prefix hits, and their hashes."""
    return views.request(engine, request_id)


@route(router.post, "/requests/{request_id}/tokens", Appended, "Append decode tokens", WriteAuth)
async def append(engine: EngineDep, request_id: Rid, body: AppendBody) -> AsBuilt[Appended]:
    return await run(engine, AppendOp(request_id=request_id, token_ids=body.token_ids))


@route(router.post, "/requests/{request_id}/verify", Verified, "Verify its K/V", CostlyRead)
async def verify(engine: EngineDep, request_id: Rid) -> Verified:
    """Check bit for bit that the request's blocks hold the K/V the stand-in
    model computes for its tokens (prefix hits included).  409 when the
    server runs without storage."""
    verified: Verified = await engine.submit(lambda: views.verify(engine, request_id))
    return verified


@route(router.post, "/requests/{request_id}/finish", Finished, "Finish", WriteAuth)
async def finish(engine: EngineDep, request_id: Rid) -> AsBuilt[Finished]:
    """Frees the request's blocks in reverse (its shared prefix is evicted last)."""
    return await run(engine, FinishOp(request_id=request_id))


@router.post(
    "/batch",
    responses=returns(Batch),
    dependencies=[WriteAuth],
    tags=["batch"],
    summary="Many operations",
)
async def batch(body: BatchRequest, engine: EngineDep) -> AsBuilt[Batch]:
    """Operations run in order in one engine step; the whole batch is checked
    against the limits first (413/422, nothing applied).  By default
    (``on_error: rollback``) the batch is all or nothing: if any operation
    would be refused, nothing changes and the answer is that refusal (its
    status and code, ``details.op_index`` naming it).  With ``stop`` or
    ``continue`` operations apply one by one (each all-or-nothing) and the
    results come per operation (``ok`` + ``result`` or ``error``); ``stop``
    skips the rest after the first refusal.

    A refused all-or-nothing batch, of one operation or many, counts once in
    ``operations_refused`` (``blockpool_operations_refused``) and is not in
    the recording: the pool, the other counters, the event log and the
    recording stay as they were (it was tried on a spare pool).  With
    ``stop`` / ``continue`` each operation is applied, recorded and counted
    as if sent alone."""
    limit = engine.settings.max_batch_ops
    if len(body.ops) > limit:
        raise TooLarge(
            f"batch: {len(body.ops)} operations, the limit is {limit}",
            given=len(body.ops),
            limit=limit,
        )
    rops = body.operations()
    for i, op in enumerate(rops):
        try:
            engine.precheck(op)
        except OperationError as exc:
            exc.details["op_index"] = i
            exc.message = f"ops[{i}]: {exc.message}"
            raise
    atomic = body.on_error == "rollback"

    def refusal(i: int, exc: OperationError) -> OperationError:
        details = {**exc.details, "op_index": i, "op": rops[i].op}
        return type(exc)(
            f"ops[{i}]: {exc.message} (the batch was not applied: nothing changed)", **details
        )

    def apply() -> Batch:
        if atomic:
            try:
                done = apply_all(engine.runtime, rops, engine.apply, dry_run_one=True)
            except BatchRefused as refused:
                raise refusal(refused.index, refused.error) from None
            oks: list[BatchResult] = [{"ok": True, "result": r} for r in done]
            return {"applied": len(done), "failed": 0, "errors": False, "results": oks}
        results: list[BatchResult] = []
        failed = 0
        for op in rops:
            if failed and body.on_error != "continue":
                results.append({"ok": False, "skipped": True})
                continue
            try:
                results.append({"ok": True, "result": engine.apply(op)})
            except OperationError as exc:
                failed += 1
                results.append({"ok": False, "error": body_of(exc)["error"]})
        applied = sum(1 for r in results if r["ok"])
        return {"applied": applied, "failed": failed, "errors": failed > 0, "results": results}

    result: Batch = await engine.submit(apply)
    return result
