"""Ephemeral (RAM-class) queues, ``/api/v1/ephemeral/*`` (docs/ephemeral.md): configure, reset,
delete, push, pop, ack, queues, depth. Each handler reads the queue name first, then parses
the rest with wire/ephemeral.py, calls broker/service/ephemeral.py and shapes the answer.
Between the name and the service call, a queue another broker owns has its request passed on
to that broker (broker/http/forward.py; docs/ephemeral.md, "Ownership").

Any other path or method under the family answers 404 ``ephemeral_unsupported``: the official
clients read a 404 whose code is not ``ephemeral_queue_not_found`` as "this broker does not
offer that verb", which is true."""
from __future__ import annotations

import ujson
from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.forward import at_owner
from broker.http.responses import RETRY_AFTER_SECONDS, args, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire import ephemeral as wire
from broker.service import ephemeral as service
from broker.service.ephemeral import MemoryFull

bp = Blueprint("ephemeral")

_PREFIX = "/api/v1/ephemeral"
_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


@bp.post(f"{_PREFIX}/push")
async def push(request: BrokerRequest):
    body, queue = wire.queue_of(read_json(request))
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    ctx = request.app.ctx
    partition, items, nbytes = wire.parse_push(body, ctx.settings.push_max_items_per_request)
    answer, status = wire.push_answer(service.push(ctx, queue, partition, items, nbytes))
    response = json(answer, status)
    if status == 429:  # the queue is full: consumers make room (503 carries it already)
        response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


@bp.get(f"{_PREFIX}/pop")
async def pop(request: BrokerRequest):
    query = args(request)
    queue = wire.pop_queue(query)
    queue_json = ujson.dumps(queue, ensure_ascii=False, escape_forward_slashes=False)
    if request.method == "HEAD":  # a HEAD must not take messages
        return HTTPResponse(wire.pop_body(queue_json, []), content_type="application/json")
    settings = request.app.ctx.settings
    req = wire.parse_pop(query, queue, settings.default_batch_size, settings.default_timeout)
    if (owner := await at_owner(request, queue, req.timeout_ms if req.wait else 0)) is not None:
        return owner
    try:
        taken = await service.pop(request.app.ctx, req)
    except MemoryFull as exc:  # a new queue or group finds no room
        return _memory_full(exc)
    return HTTPResponse(wire.pop_body(queue_json, taken), content_type="application/json")


@bp.post(f"{_PREFIX}/ack")
async def ack(request: BrokerRequest):
    body, queue = wire.queue_of(read_json(request))
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    ctx = request.app.ctx
    group, acks = wire.parse_ack(body, ctx.settings.push_max_items_per_request)
    return json(wire.ack_answer(acks, service.ack(ctx, queue, group, acks)))


@bp.post(f"{_PREFIX}/configure")
async def configure(request: BrokerRequest):
    body, queue = wire.queue_of(read_json(request))
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    knobs = wire.parse_configure(body)
    try:
        options = await service.configure(request.app.ctx, queue, knobs)
    except MemoryFull as exc:
        return _memory_full(exc)
    return json(wire.configure_answer(queue, options))


@bp.post(f"{_PREFIX}/reset")
async def reset(request: BrokerRequest):
    _body, queue = wire.queue_of(read_json(request))
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    return json({"queue": queue, "dropped": service.reset(request.app.ctx, queue)})


@bp.delete(f"{_PREFIX}/queue/<queue:str>", unquote=True)
async def delete(request: BrokerRequest, queue: str):
    queue = wire.path_queue(queue)
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    return json({"queue": queue, "deleted": await service.delete(request.app.ctx, queue)})


@bp.get(f"{_PREFIX}/queues")
async def queues(request: BrokerRequest):
    return json(wire.queues_answer(service.queues(request.app.ctx)))


@bp.get(f"{_PREFIX}/queues/<queue:str>/depth", unquote=True)
async def depth(request: BrokerRequest, queue: str):
    queue = wire.path_queue(queue)
    if (owner := await at_owner(request, queue)) is not None:
        return owner
    figures = service.depth(request.app.ctx, queue)
    if figures is None:
        return json(wire.not_found(queue), 404)
    return json(wire.depth_answer(figures))


def _memory_full(exc: MemoryFull) -> HTTPResponse:
    """503 (Retry-After), the shape of a push refused for memory."""
    return json({"error": wire.MEMORY, "code": wire.MEMORY, "detail": str(exc)}, 503)


async def _unsupported(request: BrokerRequest, **_path: str):
    return json({"error": "ephemeral_unsupported",
                 "detail": f"{request.method} {request.path} is not a verb of this broker's "
                           "ephemeral queues (configure, reset, delete, push, pop, ack, "
                           "queues, depth)"}, 404)


bp.add_route(_unsupported, _PREFIX, methods=_METHODS, name="ephemeral_root")
bp.add_route(_unsupported, f"{_PREFIX}/<rest:path>", methods=_METHODS, name="ephemeral_any")
