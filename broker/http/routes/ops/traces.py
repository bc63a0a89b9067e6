"""Message traces (docs/wire-contract.md §14.1): record from consumers, read by message and
by name."""
from __future__ import annotations

from urllib.parse import unquote

from sanic import Blueprint

from broker.core.domain import QUEUE_MODE
from broker.core.errors import BadRequest
from broker.core.times import iso_milli, parse_timestamp
from broker.http.responses import args, error, json, read_json
from broker.http.routes.ops.common import path_uuid
from broker.http.types import BrokerRequest
from broker.http.wire.ack import is_partition_handle
from broker.http.wire.common import MAX_NAME, body_object, q_int, q_str
from broker.service import traces as service

bp = Blueprint("ops_traces")

MAX_TRACE_NAMES = 100


def _names(value) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise BadRequest("traceNames must be a string, an array of strings or null")
    names = []
    for name in value:
        if not isinstance(name, str):
            raise BadRequest("traceNames must contain strings")
        if len(name) > MAX_NAME:
            raise BadRequest(f"trace names must be at most {MAX_NAME} characters")
        if name and name not in names:
            names.append(name)
    if len(names) > MAX_TRACE_NAMES:
        raise BadRequest(f"at most {MAX_TRACE_NAMES} trace names per event")
    return names


def _trace(r) -> dict:
    """A trace event in snake_case, as Queen's tools read it."""
    out = {"id": str(r["id"]), "message_id": str(r["message_id"]),
           "partition_id": str(r["partition_id"]), "transaction_id": r["transaction_id"],
           "consumer_group": r["consumer_group"], "event_type": r["event_type"],
           "trace_names": list(r["names"] or []), "data": r["data"], "worker_id": r["worker_id"],
           "created_at": iso_milli(r["created_at"])}
    if "queue" in r.keys():
        out["queue_name"], out["partition_name"] = r["queue"], r["partition"]
        out["message_payload"] = r["payload"]
    return out


@bp.post("/api/v1/traces")
async def add_trace(request: BrokerRequest):
    body = body_object(read_json(request))
    txid, pid = body.get("transactionId"), body.get("partitionId")
    if not isinstance(txid, str) or not txid or not isinstance(pid, str) or not pid:
        raise BadRequest("transactionId and partitionId are required")
    if not is_partition_handle(pid):  # a framed pop's messages name theirs so
        path_uuid(pid, "partitionId")
    if body.get("data") is None:
        raise BadRequest("data is required")
    group = body.get("consumerGroup") or QUEUE_MODE
    event_type = body.get("eventType") or "info"
    if not isinstance(group, str) or len(group) > MAX_NAME:
        raise BadRequest("consumerGroup must be a string")
    if not isinstance(event_type, str) or len(event_type) > MAX_NAME:
        raise BadRequest("eventType must be a string")
    trace_id = await service.add_trace(
        request.app.ctx, partition_id=pid, transaction_id=txid, group=group,
        event_type=event_type, data=body["data"], names=_names(body.get("traceNames")))
    if trace_id is None:
        return json({"success": False, "error": "Message not found"}, status=404)
    return json({"success": True, "traceId": trace_id}, status=201)


@bp.get("/api/v1/traces/names")
async def trace_names(request: BrokerRequest):
    a = args(request)
    limit = q_int(a, "limit", 50, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    rows = await service.trace_names(request.app.ctx, q_str(a, "search"), limit, offset)
    return json({"trace_names": [{"trace_name": r["trace_name"], "trace_count": r["trace_count"],
                                  "message_count": r["message_count"],
                                  "first_seen": iso_milli(r["first_seen"]),
                                  "last_seen": iso_milli(r["last_seen"])} for r in rows],
                 "total": rows[0]["full_count"] if rows else None,
                 "pagination": {"limit": limit, "offset": offset}})


@bp.get("/api/v1/traces/by-name/<name:str>", unquote=True)
async def traces_by_name(request: BrokerRequest, name: str):
    return await _by_name(request, name)


@bp.get("/api/v1/traces/by-name/<name:path>", name="traces_by_name_with_slash")
async def traces_by_name_with_slash(request: BrokerRequest, name: str):
    """Names containing '/' (clients leave it unencoded). The router does not
    unquote path-typed parameters, so decode here."""
    return await _by_name(request, unquote(name))


async def _by_name(request: BrokerRequest, name: str):
    a = args(request)
    limit = q_int(a, "limit", 100, minimum=1, maximum=1000)
    offset = q_int(a, "offset", 0, minimum=0)
    since = parse_timestamp(a["from"], "from") if q_str(a, "from") else None
    until = parse_timestamp(a["to"], "to") if q_str(a, "to") else None
    total, rows = await service.traces_by_name(request.app.ctx, name, since, until,
                                               limit, offset)
    return json({"traceName": name, "traces": [_trace(r) for r in rows], "total": total,
                 "pagination": {"limit": limit, "offset": offset}})


@bp.get("/api/v1/traces/<partition_id:str>/<transaction_id:str>", unquote=True)
async def traces_for_message(request: BrokerRequest, partition_id: str, transaction_id: str):
    path_uuid(partition_id, "partitionId")
    rows = await service.traces_for_message(request.app.ctx, partition_id, transaction_id)
    if rows is None:
        return error("Message not found", 404)
    return json({"partitionId": partition_id, "transactionId": transaction_id,
                 "traces": [_trace(r) for r in rows], "count": len(rows)})


