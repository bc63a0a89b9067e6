"""Acknowledgements, transactions and lease renewal (docs/wire-contract.md §6–§8): parse, call
the service, answer."""
from __future__ import annotations

from sanic import Blueprint

from broker.http.responses import json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.ack import (
    ack_answer,
    lease_answer,
    parse_ack_batch,
    parse_ack_item,
    parse_group,
    parse_lease_extension,
)
from broker.http.wire.common import body_object
from broker.http.wire.push import check_item_count
from broker.http.wire.push_binary import is_binary, parse_binary_transaction
from broker.http.wire.transaction import (
    parse_transaction,
    transaction_answer,
    transaction_counts,
)
from broker.service import ack as service
from broker.service.push import checked_producer_sub

bp = Blueprint("ack")


@bp.post("/api/v1/ack")
async def ack(request: BrokerRequest):
    body = body_object(read_json(request))
    row = parse_ack_item(body, parse_group(body.get("consumerGroup")), batch=False,
                         handles=True)
    return json(ack_answer([row], await service.ack(request.app.ctx, [row])))


@bp.post("/api/v1/ack/batch")
async def ack_batch(request: BrokerRequest):
    rows = parse_ack_batch(body_object(read_json(request)))
    if not rows:
        return json([])
    return json(ack_answer(rows, await service.ack(request.app.ctx, rows)))


@bp.post("/api/v1/transaction")
async def transaction(request: BrokerRequest):
    counts = False
    if is_binary(request):  # the client's binary_push + push_compression body (QTB1)
        binary = parse_binary_transaction(request.body or b"",
                                          request.app.ctx.settings.max_body_bytes)
        flat, required, riders = parse_transaction(binary.head, binary.items)
        counts = binary.counts
    else:
        flat, required, riders = parse_transaction(read_json(request))
    check_item_count(len(flat), request.app.ctx.settings.push_max_items_per_request)
    outcome = await service.transaction(
        request.app.ctx, flat, required,
        checked_producer_sub(getattr(request.ctx, "producer_sub", None)), riders)
    answer = transaction_answer(outcome, flat, riders)
    return json(transaction_counts(answer) if counts else answer)


@bp.post("/api/v1/lease/<lease_id:str>/extend", unquote=True)
async def extend_lease(request: BrokerRequest, lease_id: str):
    seconds = parse_lease_extension(body_object(read_json(request)), lease_id)
    renewed, expires, err = await service.extend_lease(request.app.ctx, lease_id, seconds)
    return json(lease_answer(lease_id, renewed, expires, err))
