"""Timers: ``POST /api/v1/timers`` (schedule, reschedule, cancel; READ_WRITE),
``DELETE /api/v1/timers/<queue>/<key>`` (the cancel route of its own, ``?txn=`` echoed
on ``absent``), ``GET /api/v1/timers/<queue>/<key>`` (peek) and
``GET /api/v1/timers/<queue>`` (a keyset page, or with ``?mode=count&prefix=`` the count of
the pending timers under a key prefix; READ_ONLY)."""
from __future__ import annotations

from urllib.parse import unquote

from sanic import Blueprint

from broker.http.responses import args, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.timers import (
    parse_timer_batch,
    parse_timer_cancel,
    parse_timer_count,
    parse_timer_page,
    timer_address,
    timer_batch_answer,
    timer_count_answer,
)
from broker.service import timers as service
from broker.service.push import checked_producer_sub

bp = Blueprint("timers")


@bp.post("/api/v1/timers")
async def timers_batch(request: BrokerRequest):
    ops = parse_timer_batch(read_json(request))
    if not ops:
        return json(timer_batch_answer([]))
    sub = checked_producer_sub(getattr(request.ctx, "producer_sub", None))
    return json(timer_batch_answer(await service.batch(request.app.ctx, ops, sub)))


@bp.delete("/api/v1/timers/<queue:str>/<key:path>", unquote=True)
async def timers_cancel(request: BrokerRequest, queue: str, key: str):
    key = unquote(key)  # Sanic leaves a <path> parameter percent-encoded
    op = parse_timer_cancel(queue, key, args(request).get("txn") or None)
    return json(await service.cancel(request.app.ctx, op))


@bp.get("/api/v1/timers/<queue:str>/<key:path>", unquote=True)
async def timers_peek(request: BrokerRequest, queue: str, key: str):
    key = unquote(key)  # Sanic leaves a <path> parameter percent-encoded
    queue, timer_key = timer_address(queue, key)
    assert timer_key is not None
    return json(await service.peek(request.app.ctx, queue, timer_key))


@bp.get("/api/v1/timers/<queue:str>", unquote=True)
async def timers_list(request: BrokerRequest, queue: str):
    queue, _ = timer_address(queue)
    prefix = parse_timer_count(args(request))
    if prefix is not None:
        return json(timer_count_answer(queue, prefix,
                                       await service.count(request.app.ctx, queue, prefix)))
    after, limit = parse_timer_page(args(request))
    return json(await service.page(request.app.ctx, queue, after, limit))
