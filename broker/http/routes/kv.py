"""Key/value: ``POST /api/v1/kv`` (the batch, the whole surface) and the path-style
sugar ``GET|PUT|DELETE /api/v1/kv/<ns>/<key>`` (one key; an ETag carries the version,
``If-Match`` / ``If-None-Match: *`` are ``expect``). Reads need READ_ONLY, a batch
with a write READ_WRITE."""
from __future__ import annotations

from urllib.parse import unquote

from sanic import Blueprint
from sanic.response import HTTPResponse

from broker.http.auth import writes_allowed
from broker.http.responses import error, json, read_json
from broker.http.types import BrokerRequest
from broker.http.wire.kv import (
    kv_batch_answer,
    kv_key_answer,
    parse_kv_batch,
    parse_kv_delete,
    parse_kv_get,
    parse_kv_put,
)
from broker.service import kv as service
from broker.service.kv import KvOp

bp = Blueprint("kv")


def _forbidden_writes(request: BrokerRequest, writes: bool) -> HTTPResponse | None:
    if writes and not writes_allowed(request):
        return error("Insufficient permissions", 403)
    return None


@bp.post("/api/v1/kv")
async def kv_batch(request: BrokerRequest):
    ops = parse_kv_batch(read_json(request))
    refused = _forbidden_writes(request, any(op.writes for op in ops))
    if refused is not None:
        return refused
    return json(kv_batch_answer(await service.batch(request.app.ctx, ops)))


async def _one(request: BrokerRequest, op: KvOp) -> HTTPResponse:
    refused = _forbidden_writes(request, op.writes)
    if refused is not None:
        return refused
    result = (await service.batch(request.app.ctx, [op])).results[0]
    body, status, etag = kv_key_answer(op, result)
    response = json(body, status)
    if etag is not None:
        response.headers["ETag"] = etag
    return response


# Each key is unquoted: Sanic leaves a <path> parameter percent-encoded.

@bp.get("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_get(request: BrokerRequest, ns: str, key: str):
    return await _one(request, parse_kv_get(ns, unquote(key)))


@bp.put("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_put(request: BrokerRequest, ns: str, key: str):
    headers = request.headers
    return await _one(request, parse_kv_put(ns, unquote(key), read_json(request),
                                            headers.get("if-match"),
                                            headers.get("if-none-match")))


@bp.delete("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_delete(request: BrokerRequest, ns: str, key: str):
    headers = request.headers
    return await _one(request, parse_kv_delete(ns, unquote(key), headers.get("if-match"),
                                               headers.get("if-none-match")))
