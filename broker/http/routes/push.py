"""POST /api/v1/push (docs/wire-contract.md §4): parse, push through the service, shape the
answer."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.push import check_item_count, parse_push, push_answer
from broker.service import push as service

bp = Blueprint("push")

# HTTP status per outcome: 200 stored (or partly stored, partly spooled), 201
# when everything waits in the spool, 503 with Retry-After when nothing of the
# spooled part was acknowledged.
_STATUS = {"stored": 200, "mixed": 200, "buffered": 201, "full": 503, "failed": 503}


@bp.post("/api/v1/push")
async def push(request: BrokerRequest):
    ctx = request.app.ctx
    producer_sub = service.checked_producer_sub(getattr(request.ctx, "producer_sub", None))
    items = parse_push(read_json(request))
    check_item_count(len(items), ctx.settings.push_max_items_per_request)
    if not items:
        return json([], status=201)
    outcome = await service.push(ctx, items, producer_sub)
    if outcome.outcome == "full":
        return json({"error": outcome.error}, status=503)  # Retry-After: send it again
    return json(push_answer(outcome), status=_STATUS[outcome.outcome])
