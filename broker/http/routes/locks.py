"""Locks and semaphores: ``POST /api/v1/locks`` (acquire, renew, release, get). A lock
held by somebody else or a token that is no longer the permit's is a verdict in the
result (HTTP 200), never an error status. ``get`` needs READ_ONLY, the rest READ_WRITE."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.auth import writes_allowed
from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.locks import lock_batch_answer, parse_lock_batch
from broker.service import locks as service

bp = Blueprint("locks")


@bp.post("/api/v1/locks")
async def locks(request: BrokerRequest):
    ops = parse_lock_batch(read_json(request), service.minted_owner())
    if any(op.op != "get" for op in ops) and not writes_allowed(request):
        return error("Insufficient permissions", 403)
    return json(lock_batch_answer(await service.run(request.app.ctx, ops)))
