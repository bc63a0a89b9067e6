"""The operator's view of the streaming queries: GET /api/v1/status/streams (every query
with its state size and committed cycles) and GET /api/v1/status/streams/<name> (one query
and its source partitions). The figures come from broker/service/streams.py, the shapes
(and what each figure means) from broker/http/wire/streams.py."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import args, json
from broker.http.types import BrokerRequest
from broker.http.wire.streams import (
    no_such_query,
    parse_status_of,
    status_answer,
    status_of_answer,
)
from broker.service import streams as service

bp = Blueprint("ops_streams")


@bp.get("/api/v1/status/streams")
async def streams_status(request: BrokerRequest):
    return json(status_answer(await service.status(request.app.ctx)))


@bp.get("/api/v1/status/streams/<name:str>", unquote=True)
async def stream_status(request: BrokerRequest, name: str):
    limit = parse_status_of(name, args(request))
    found = await service.status_of(request.app.ctx, name, limit)
    if found is None:
        return json(no_such_query(name), status=404)
    return json(status_of_answer(*found))
