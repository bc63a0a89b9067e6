"""The /streams/v1 routes the official clients' streaming SDK runs on: register a query,
commit a cycle, read state; plus list and delete queries for operators. Each parses with
broker/http/wire/streams.py, calls broker/service/streams.py, shapes with wire."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.streams import (
    cycle_answer,
    cycle_unknown_answer,
    deleted_answer,
    parse_cycle,
    parse_register,
    parse_state_get,
    queries_answer,
    register_answer,
    state_answer,
)
from broker.service import streams as service
from broker.service.push import checked_producer_sub

bp = Blueprint("streams")


@bp.post("/streams/v1/queries")
async def register_query(request: BrokerRequest):
    spec = parse_register(read_json(request))
    body, status = register_answer(spec, await service.register_query(request.app.ctx, spec))
    return json(body, status=status)


@bp.get("/streams/v1/queries")
async def list_queries(request: BrokerRequest):
    return json(queries_answer(await service.list_queries(request.app.ctx)))


@bp.delete("/streams/v1/queries/<name:str>", unquote=True)
async def delete_query(request: BrokerRequest, name: str):
    body, status = deleted_answer(name, await service.delete_query(request.app.ctx, name))
    return json(body, status=status)


@bp.post("/streams/v1/cycle")
async def cycle(request: BrokerRequest):
    ctx = request.app.ctx
    req = parse_cycle(read_json(request), ctx.settings.push_max_items_per_request)
    try:
        out = await service.cycle(ctx, req, checked_producer_sub(
            getattr(request.ctx, "producer_sub", None)))
    except service.UnknownTarget as exc:
        return json(cycle_unknown_answer(req, exc.reason), status=404)
    return json(cycle_answer(req, out))


@bp.post("/streams/v1/state/get")
async def state_get(request: BrokerRequest):
    read = parse_state_get(read_json(request))
    return json(state_answer(await service.read_state(request.app.ctx, read)))
