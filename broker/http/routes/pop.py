"""The three pop routes (docs/wire-contract.md §5): parse, pop through the service, answer."""
from __future__ import annotations

from sanic import Blueprint, Request

from broker.http.responses import args, json
from broker.http.wire.messages import parse_pop
from broker.service import pop as service

bp = Blueprint("pop")


@bp.get("/api/v1/pop/queue/<queue:str>/partition/<partition:str>", unquote=True)
async def pop_partition(request: Request, queue: str, partition: str):
    return await _pop(request, queue, partition)


@bp.get("/api/v1/pop/queue/<queue:str>", unquote=True)
async def pop_queue(request: Request, queue: str):
    return await _pop(request, queue, None)


@bp.get("/api/v1/pop")
async def pop_discovery(request: Request):
    return await _pop(request, None, None)


async def _pop(request: Request, queue: str | None, partition: str | None):
    ctx = request.app.ctx
    settings = ctx.settings
    req = parse_pop(args(request), queue=queue, partition=partition,
                    default_batch=settings.default_batch_size,
                    default_timeout_ms=settings.default_timeout,
                    default_subscription_mode=settings.default_subscription_mode)
    return json(await service.pop(ctx, req))
