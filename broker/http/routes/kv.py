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
from broker.http.wire.common import body_object
from broker.http.wire.kv import kv_batch_answer, kv_refusal, parse_kv_batch, parse_kv_op
from broker.service import kv as service

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


def _with_etag(response: HTTPResponse, version: int | None) -> HTTPResponse:
    if version is not None:
        response.headers["ETag"] = f'"{version}"'
    return response


def _if_match(request: BrokerRequest) -> dict:
    """``expect`` from the conditional headers of a sugar route."""
    match, none_match = request.headers.get("if-match"), request.headers.get("if-none-match")
    if match is not None and none_match is not None:
        raise kv_refusal("give If-Match or If-None-Match, not both", "kv_bad_expect")
    if none_match is not None:
        if none_match.strip() != "*":
            raise kv_refusal("If-None-Match takes only *", "kv_bad_expect")
        return {"expect": 0}
    if match is not None:
        tag = match.strip().removeprefix("W/").strip('"')
        if not tag.isdigit():
            raise kv_refusal("If-Match must be an ETag of this route (a version)",
                             "kv_bad_expect")
        return {"expect": int(tag)}
    return {}


async def _one(request: BrokerRequest, raw: dict, status_when_refused: int) -> HTTPResponse:
    op = parse_kv_op(raw, "request")
    refused = _forbidden_writes(request, op.writes)
    if refused is not None:
        return refused
    result = (await service.batch(request.app.ctx, [op])).results[0]
    if not result.get("applied"):
        return json(result, status_when_refused)
    return _with_etag(json(result), result.get("version"))


@bp.get("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_get(request: BrokerRequest, ns: str, key: str):
    key = unquote(key)  # Sanic leaves a <path> parameter percent-encoded
    op = parse_kv_op({"op": "get", "ns": ns, "key": key}, "request")
    result = (await service.batch(request.app.ctx, [op])).results[0]
    if not result["found"]:
        return json({"error": "kv_not_found", "detail": f"no live key {key!r} in {ns!r}"}, 404)
    return _with_etag(json(result), result["version"])


@bp.put("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_put(request: BrokerRequest, ns: str, key: str):
    key = unquote(key)  # Sanic leaves a <path> parameter percent-encoded
    body = dict(body_object(read_json(request)))
    for field in ("op", "ns", "key", "expect"):
        if field in body:
            raise kv_refusal(f"{field} comes from the path and the headers, not the body")
    return await _one(request, {**body, "op": "put", "ns": ns, "key": key,
                                **_if_match(request)}, 412)


@bp.delete("/api/v1/kv/<ns:str>/<key:path>", unquote=True)
async def kv_delete(request: BrokerRequest, ns: str, key: str):
    key = unquote(key)  # Sanic leaves a <path> parameter percent-encoded
    raw = {"op": "delete", "ns": ns, "key": key, **_if_match(request)}
    # A delete of a key that is not there is idempotent (200, applied false); only a
    # version that does not match is a failed precondition.
    return await _one(request, raw, 412 if "expect" in raw else 200)
