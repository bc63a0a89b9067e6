"""POST /api/v1/push (docs/wire-contract.md §4): parse, push through the service, shape the
answer."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.push import check_item_count, parse_push, push_answer
from broker.http.wire.push_binary import counts_answer, is_binary, parse_binary_push
from broker.service import push as service

bp = Blueprint("push")

# HTTP status per outcome: 200 stored (or partly stored, partly spooled, partly
# refused), 201 when everything waits in the spool, 503 with Retry-After when nothing
# of the spooled part was acknowledged, 409 when every item was refused because its
# queue would pass maxSize (not retried by the client as it is; its buffered producer
# sends the batch again later, when consumers made room).
_STATUS = {"stored": 200, "mixed": 200, "buffered": 201, "full": 503, "failed": 503,
           "refused": 409}


@bp.post("/api/v1/push")
async def push(request: BrokerRequest):
    ctx = request.app.ctx
    producer_sub = service.checked_producer_sub(getattr(request.ctx, "producer_sub", None))
    counts = False
    if is_binary(request):  # the client's binary_push body (QPB1), docs/wire-contract.md §4.2
        binary = parse_binary_push(request.body or b"", ctx.settings.max_body_bytes)
        items, counts = binary.items, binary.counts
    else:
        items = parse_push(read_json(request))
    check_item_count(len(items), ctx.settings.push_max_items_per_request)
    if not items:
        return json([], status=201)
    outcome = await service.push(ctx, items, producer_sub)
    if outcome.outcome == "full":
        return json({"error": outcome.error}, status=503)  # Retry-After: send it again
    if outcome.outcome == "refused":
        return json({"error": outcome.error, "code": "max_size"}, status=409)
    answer = push_answer(outcome)
    if counts:
        return json(counts_answer([a["status"] for a in answer]), status=_STATUS[outcome.outcome])
    return json(answer, status=_STATUS[outcome.outcome])
