"""The three pop routes (docs/wire-contract.md §5): parse, pop through the service, answer."""
from __future__ import annotations

from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.responses import args, json_text
from broker.http.types import BrokerRequest
from broker.http.wire import pop_frames
from broker.http.wire.pop import own_keys, parse_pop, pop_answer
from broker.service import pop as service

bp = Blueprint("pop")


@bp.get("/api/v1/pop/queue/<queue:str>/partition/<partition:str>", unquote=True)
async def pop_partition(request: BrokerRequest, queue: str, partition: str):
    return await _pop(request, queue, partition)


@bp.get("/api/v1/pop/queue/<queue:str>", unquote=True)
async def pop_queue(request: BrokerRequest, queue: str):
    return await _pop(request, queue, None)


@bp.get("/api/v1/pop")
async def pop_discovery(request: BrokerRequest):
    return await _pop(request, None, None)


async def _pop(request: BrokerRequest, queue: str | None, partition: str | None):
    ctx = request.app.ctx
    settings = ctx.settings
    req = parse_pop(args(request), queue=queue, partition=partition,
                    default_batch=settings.default_batch_size,
                    default_timeout_ms=settings.default_timeout,
                    default_subscription_mode=settings.default_subscription_mode)
    result = await service.pop(ctx, req)
    if req.frames:
        framed = pop_frames.framed_answer(req, result, own_keys(req, result))
        if framed is not None:
            return HTTPResponse(framed, content_type=pop_frames.CONTENT_TYPE)
    return json_text(pop_answer(req, result))
