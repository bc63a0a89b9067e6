"""The supervised consumers: GET /api/v1/status/supervision[?group=] (READ_ONLY, like the
other status routes), what the official clients' ``consume().supervision(...)`` publish
in the key/value namespace ``queen-supervisor``, decoded (docs/supervision.md). The
reading and checking is broker/service/supervision.py's, the shape
broker/http/wire/kv.py's."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import args, json
from broker.http.types import BrokerRequest
from broker.http.wire.kv import parse_supervision, supervision_answer
from broker.service import supervision as service

bp = Blueprint("supervision")


@bp.get("/api/v1/status/supervision")
async def supervision(request: BrokerRequest):
    group = parse_supervision(args(request))
    return json(supervision_answer(await service.supervision(request.app.ctx, group)))
