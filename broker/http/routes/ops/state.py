"""Operator views of the state surfaces: key/value namespaces and keys, held locks,
pending timers (READ_ONLY, like every operator read). The shapes follow what the
reference console reads: ``GET /api/v1/resources/kv/namespaces``
(``{namespaces: [{namespace, keys, ...}]}``) and ``POST /api/v1/resources/kv/list``
(``{rows, truncated, nextAfter}``, the cursor in the body because it is a key); the lock
and timer overviews are this broker's own. The timer list, peek and cancel routes are
routes/timers.py."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import args, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.listings import (
    kv_listing_answer,
    locks_listing_answer,
    parse_kv_listing,
    parse_locks_listing,
)
from broker.service import state_ops as service

bp = Blueprint("ops_state")


@bp.get("/api/v1/resources/kv/namespaces")
async def kv_namespaces(request: BrokerRequest):
    return json(await service.kv_namespaces(request.app.ctx))


@bp.post("/api/v1/resources/kv/list")
async def kv_list(request: BrokerRequest):
    q = parse_kv_listing(read_json(request), service.KV_PAGE_DEFAULT, service.KV_PAGE_MAX)
    return json(kv_listing_answer(await service.kv_list(request.app.ctx, q)))


@bp.get("/api/v1/resources/locks")
async def locks(request: BrokerRequest):
    prefix, after, limit = parse_locks_listing(args(request), service.LOCKS_PAGE_DEFAULT,
                                               service.LOCKS_PAGE_MAX)
    return json(locks_listing_answer(await service.locks(request.app.ctx, prefix, after, limit)))


@bp.get("/api/v1/resources/timers")
async def timers(request: BrokerRequest):
    return json(await service.timers(request.app.ctx))
